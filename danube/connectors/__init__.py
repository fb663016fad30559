"""The connectors shipped with the project, one module each, registered in the
``danube.connectors`` entry-point group (pyproject.toml) under upstream's names
(``source-mqtt``, ``sink-deltalake``, ...). Their third-party libraries come with the
``connect`` extra: ``pip install 'danube-broker-py[connect]'``."""
