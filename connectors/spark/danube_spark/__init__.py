"""PySpark data source for Danube topics (`format("danube")`).

    from danube_spark import DanubeDataSource
    spark.dataSource.register(DanubeDataSource)
    spark.read.format("danube").option("service_url", "http://127.0.0.1:6650") \\
        .option("topic", "/default/events").load()
"""

__all__ = ["DanubeDataSource"]


def __getattr__(name):
    # pyspark is imported only when the data source is asked for, so the planning and
    # message modules stay usable (and testable) without it.
    if name == "DanubeDataSource":
        from danube_spark.datasource import DanubeDataSource
        return DanubeDataSource
    raise AttributeError(name)
