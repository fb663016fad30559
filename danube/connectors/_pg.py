"""What the PostgreSQL connectors share: the ``[postgres]`` connection keys, connecting with
psycopg 3 (asyncio), which errors mean "PostgreSQL is down" (retried without end by the
runtime) and which mean "this cannot work", and table names."""

from danube.connect import ConfigError, Field, Unavailable

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql
except ImportError as exc:      # pragma: no cover - reported by the registry with the extra
    raise ImportError(f"the PostgreSQL connectors need psycopg 3: {exc}",
                      name="psycopg") from None


def _conninfo(value):
    if not value.strip():
        return "must not be empty"
    try:
        psycopg.conninfo.conninfo_to_dict(value)
    except psycopg.ProgrammingError as exc:
        return f"not a PostgreSQL connection string or URL: {str(exc).strip()}"
    return None


CONNECTION = {
    # libpq's: a URL (postgresql://user@host:5432/db) or key=value words. The password is
    # best left out of the file: PGPASSWORD, or ~/.pgpass, as for psql.
    "connection_url": Field(str, env="POSTGRES_URL", check=_conninfo),
    "connect_timeout_secs": Field(int, 10, min=1, max=3600),
    "application_name": Field(str, "danube-connect"),
}


def qualified(name):
    """``schema.table`` (``public`` when no schema is given) as a (schema, table) pair, or
    a reason the name is not one. Names are taken as written (quoted in SQL), so use
    PostgreSQL's folded lower case for unquoted names."""
    parts = name.split(".")
    if len(parts) == 1:
        parts = ["public", parts[0]]
    if len(parts) != 2 or not all(parts) or any("\x00" in p for p in parts):
        return None
    return parts[0], parts[1]


def table_name(value):
    """A check for ``table`` keys."""
    return None if qualified(value) else f"{value!r} is not a table name (schema.table)"


def identifier(value):
    """A check for slot and publication names: PostgreSQL's rules for a slot name (lower
    case letters, digits, underscore; at most 63)."""
    if not value or len(value) > 63 or not all(c.islower() or c.isdigit() or c == "_"
                                               for c in value if c.isascii()) or \
            not value.isascii():
        return f"{value!r}: use at most 63 lower-case letters, digits or '_'"
    return None


def table_sql(schema, table):
    return sql.Identifier(schema, table)


def is_outage(exc):
    """True for errors that say PostgreSQL cannot be reached or went away (connection
    refused or lost, shutting down, starting up, too many connections): another try later
    may work. The rest (a bad value, a missing table, no permission) will not."""
    if isinstance(exc, (pg_errors.AdminShutdown, pg_errors.CrashShutdown,
                        pg_errors.CannotConnectNow, pg_errors.TooManyConnections,
                        pg_errors.ConnectionException)):
        return True
    return isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None


def is_transient(exc):
    """True for errors of a busy server that the same statement may pass later: a
    serialization failure or deadlock (class 40), a lock not available, a statement
    cancelled by its timeout."""
    return isinstance(exc, (pg_errors.TransactionRollback, pg_errors.LockNotAvailable,
                            pg_errors.QueryCanceled))


async def connect(settings, autocommit=True):
    """A connection, or Unavailable when PostgreSQL cannot be reached (refused, timed out,
    starting up); ConfigError when it answers no (authentication, no such database)."""
    try:
        return await psycopg.AsyncConnection.connect(
            settings.connection_url, autocommit=autocommit,
            connect_timeout=settings.connect_timeout_secs,
            application_name=settings.application_name)
    except psycopg.Error as exc:
        if _refused_for_good(exc):
            raise ConfigError(f"postgres.connection_url: PostgreSQL refused the "
                              f"connection: {_first_line(exc)}") from None
        raise Unavailable(f"cannot connect to PostgreSQL: {_first_line(exc)}") from None


def _refused_for_good(exc):
    text = str(exc)
    return any(s in text for s in ("password authentication failed", "does not exist",
                                   "no pg_hba.conf entry", "permission denied"))


def _first_line(exc):
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def describe(exc):
    """An error's first line, for logs and dead-letter reasons."""
    return _first_line(exc)


async def close_quietly(conn):
    if conn is None:
        return
    try:
        await conn.close()
    except Exception:               # noqa: BLE001 - a broken connection is being dropped
        pass
