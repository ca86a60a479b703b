"""Where the postgres store connects, and the one redaction of its password from any text.

The target is ``memorySearch.store.dsn`` (a ``postgresql://`` URI or a libpq key/value string)
or, without one, libpq's environment (``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGPASSWORD``,
``PGDATABASE``, ``PGSSLMODE``, ``PGSERVICE``), which libpq reads by itself for every key the DSN
leaves out. What messages name (host, port, database, user) is what libpq connects to: the DSN's
keys, then the connection service's (``service=`` or ``PGSERVICE``, read from
``PGSERVICEFILE`` or ``~/.pg_service.conf``, then ``$PGSYSCONFDIR/pg_service.conf``), then the
environment's, then libpq's defaults.
Every text about a connection that may leave the process (an error, a log line, ``status``)
goes through :meth:`PgTarget.redact`, which removes the password, whether it came from the DSN or
from ``PGPASSWORD``.
"""

from __future__ import annotations

import configparser
import getpass
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from fallback.settings import check_schema
from fallback.text.redact import redact_secrets

__all__ = ["DEFAULT_SCHEMA", "PgTarget", "resolve_target"]

# The schema the store's tables live in unless memorySearch.store.schema names another.
DEFAULT_SCHEMA = "qmdbridge"
# password=... in a key/value conninfo (quoted or bare).
_KV_PASSWORD = re.compile(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


@dataclass(frozen=True)
class PgTarget:
    """A resolved connection target.

    Attributes:
        conninfo: what is passed to libpq (the DSN as written; ``""`` means the environment).
        host: the host or socket folder, for messages (``localhost`` when none is set).
        port: the port, for messages.
        dbname: the database, for messages.
        user: the login role, for messages.
        schema: the schema of the store's tables.
        password: the password from the DSN or ``PGPASSWORD`` (never shown; only redacted).
    """

    conninfo: str = field(repr=False)
    host: str
    port: str
    dbname: str
    user: str
    schema: str = DEFAULT_SCHEMA
    password: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        """``database "D" on host H port P as user U`` (no password)."""
        return f'database "{self.dbname}" on host {self.host} port {self.port} as user {self.user}'

    def redact(self, text: str) -> str:
        """``text`` with this target's password and any credential-shaped text replaced by
        ``[REDACTED:password]`` markers (:func:`fallback.text.redact.redact_secrets` for URIs and
        labelled values, then the literal password wherever else it appears).

        Args:
            text: any message (an exception's text, a DSN, a log line).

        Returns:
            The text without the password.
        """
        out = _KV_PASSWORD.sub(r"\1[REDACTED:password]", redact_secrets(text))
        if self.password:
            out = out.replace(self.password, "[REDACTED:password]")
        return out


def resolve_target(dsn: str | None, *, schema: str = DEFAULT_SCHEMA,
                   env: Mapping[str, str] | None = None) -> PgTarget:
    """Resolve ``store.dsn`` (or libpq's environment) into a :class:`PgTarget`.

    Args:
        dsn: ``postgresql://user:pass@host:port/db?sslmode=...``, ``host=... dbname=...``, or
            ``None``/``""`` for libpq's environment alone.
        schema: ``store.schema``, a lower-case SQL identifier.
        env: the environment to describe (default ``os.environ``; libpq reads the real one).

    Returns:
        The target; its ``conninfo`` is the DSN unchanged.

    Raises:
        ConfigError: the DSN cannot be parsed, its connection service is not defined, or the
            schema is not a plain identifier (the message never holds the password).
    """
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    from fallback.errors import ConfigError

    env = os.environ if env is None else env
    try:
        check_schema(schema)
    except ValueError as exc:
        raise ConfigError(f"invalid value {schema!r}", key="memorySearch.store.schema",
                          expected=str(exc)) from None
    conninfo = (dsn or "").strip()
    try:
        params = conninfo_to_dict(conninfo)
    except ProgrammingError as exc:  # libpq could not parse it
        probe = PgTarget(conninfo="", host="", port="", dbname="", user="",
                         password=_password_in(conninfo) or env.get("PGPASSWORD"))
        raise ConfigError(probe.redact(f"cannot parse the DSN {conninfo!r}: {exc}"),
                          key="memorySearch.store.dsn",
                          expected="postgresql://user@host:5432/db or host=... dbname=...") from None

    service = str(params.get("service") or env.get("PGSERVICE") or "")
    # libpq's order: the DSN's keys, then the service's, then the environment's
    params = {**_service_params(service, env), **{k: v for k, v in params.items() if v}} \
        if service else params

    def pick(key: str, var: str, default: str) -> str:
        value = params.get(key) or env.get(var)
        return str(value) if value else default

    user = pick("user", "PGUSER", _os_user())
    return PgTarget(conninfo=conninfo, host=pick("host", "PGHOST", "localhost"),
                    port=pick("port", "PGPORT", "5432"), dbname=pick("dbname", "PGDATABASE", user),
                    user=user, schema=schema, password=pick("password", "PGPASSWORD", "") or None)


def _service_params(service: str, env: Mapping[str, str]) -> dict[str, str]:
    """The keys of connection service ``service`` as libpq reads them: the first of
    ``PGSERVICEFILE`` (else ``~/.pg_service.conf``) and ``$PGSYSCONFDIR/pg_service.conf`` that
    defines it.

    Raises:
        ConfigError: no such file defines it (libpq refuses to connect then too).
    """
    from fallback.errors import ConfigError

    files = [env.get("PGSERVICEFILE") or os.path.join(os.path.expanduser("~"), ".pg_service.conf")]
    if env.get("PGSYSCONFDIR"):
        files.append(os.path.join(env["PGSYSCONFDIR"], "pg_service.conf"))
    for path in files:
        parser = configparser.ConfigParser(interpolation=None, strict=False,
                                           comment_prefixes=("#",), inline_comment_prefixes=None)
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            continue  # libpq reports its own syntax error when it connects
        if parser.has_section(service):
            return {k: v.strip() for k, v in parser.items(service)}
    raise ConfigError(f"the connection service {service!r} is not defined in {' or '.join(files)}",
                      key="memorySearch.store.dsn",
                      expected="a [section] of the service file, or PGSERVICEFILE naming the file")


def _os_user() -> str:
    """libpq's default user: the operating system's user name."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "postgres"


def _password_in(conninfo: str) -> str | None:
    """A password in a DSN libpq could not parse (so it can still be redacted)."""
    m = re.search(r"://[^\s:/@]+:([^\s@/]+)@", conninfo) or _KV_PASSWORD.search(conninfo)
    if m is None:
        return None
    value = m.group(m.lastindex or 1)
    return value.strip("'") or None
