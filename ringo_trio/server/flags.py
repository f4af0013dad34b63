"""The daemon's flags: the parser (`build_parser`, one argument group per
concern: TLS, shared mode, retention, ...), the checks of what it parsed that
argparse cannot make (`settle`: token, TLS context, shared mode), and the
storage they select (`storage_choice`). Exit statuses and environment
variable names live here too, as the help text states them."""

from __future__ import annotations

import argparse
import os
import pathlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from ringo_trio._contract import limits, versions
from ringo_trio._contract.durations import FOREVER, NEVER, format_retention, parse_retention
from ringo_trio._contract.versions import SDK_VERSION

from .logs import LOG_FORMATS
from .retention import (
    DEFAULT_POSTGRES_RETENTION_BATCH,
    DEFAULT_RETAIN_CANCELLED,
    DEFAULT_RETAIN_DEAD,
    DEFAULT_RETAIN_SUCCEEDED,
    DEFAULT_RETENTION_BATCH,
    DEFAULT_RETENTION_INTERVAL,
)
from .rpc.connections import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_KEEPALIVE_TIMEOUT,
)
from .rpc.members import DEFAULT_ATTACH_TIMEOUT, DEFAULT_LINGER, MAX_GENERATION_CHARS
from .rpc.throttle import DEFAULT_CAP as DEFAULT_AUTH_FAILURE_DELAY
from .rpc.waits import DEFAULT_RECHECK_INTERVAL as DEFAULT_WAIT_RECHECK
from .storage.base import Storage

__all__ = [
    "DB_FILE_NAME",
    "EXIT_DATA_DIR_LOCKED",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "POSTGRES_DSN_ENV",
    "TOKEN_ENV",
    "StorageChoice",
    "build_parser",
    "settle",
    "storage_choice",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DATA_DIR_LOCKED = 3

DB_FILE_NAME = "ringo.db"
POSTGRES_DSN_ENV = "RINGO_POSTGRES_DSN"
# The bearer token, when neither --token nor --token-file gives one: how the
# SDK hands a private daemon its secret without showing it in the process
# list (/proc/PID/environ is readable by its owner only).
TOKEN_ENV = "RINGO_DAEMON_TOKEN"
# With PostgreSQL other daemons change the database too; their wake-ups come
# through LISTEN/NOTIFY, and this poll covers a notification lost anyway.
DEFAULT_POSTGRES_SAFETY_POLL = 5.0
DEFAULT_POSTGRES_POOL_SIZE = 10
# PostgreSQL's identifier limit (NAMEDATALEN - 1).
_MAX_SCHEMA_BYTES = 63

_DESCRIPTION = """\
The Ringo task-queue daemon: ringo.v1.QueueService and grpc.health.v1.Health
over gRPC, on an embedded SQLite store (one daemon per data dir) or on a
PostgreSQL database shared by as many daemons as you like.

Storage: --postgres DSN, else SQLite in --data-dir when given, else
PostgreSQL when $RINGO_POSTGRES_DSN is set (the way to keep a password out of
the process list), else SQLite in the default data dir.

When it serves, ringod prints one JSON line on stdout, e.g.
  {"endpoint": "127.0.0.1:7233", "pid": 4242, "protocol_minor": 6, ...}
and logs only to stderr. SIGTERM and SIGINT shut it down gracefully
(in-flight calls get --shutdown-timeout seconds), exit status 0.

With --local-token-file and --generation it is a *shared* daemon: one per data
dir for every SDK process of the machine. Every call must then carry metadata
'x-ringo-local-token', SDK processes hold AttachLocal streams as members, and
the daemon shuts down by itself (exit 0) once it has had no member for
--linger seconds, or when none attached within --attach-timeout."""

_EPILOG = f"""\
exit status: {EXIT_OK} after a graceful shutdown, {EXIT_FAILURE} when it cannot serve
(e.g. the address is in use, the database is unreachable, or the data was
written by a newer ringod),
{EXIT_USAGE} for a usage error or an unavailable option,
{EXIT_DATA_DIR_LOCKED} when another ringod holds the data dir."""


def _listen(value: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise argparse.ArgumentTypeError("write an IPv6 host in brackets: [::1]:7233")
    try:
        port = int(port_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0..65535")
    return host, port


def _minor(value: str) -> int:
    try:
        minor = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if not 0 <= minor <= versions.MINOR:
        raise argparse.ArgumentTypeError(f"{minor} is outside the served range 0..{versions.MINOR}")
    return minor


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {value!r}")
    return seconds


def _non_negative_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {value!r}")
    return seconds


def _pool_size(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if not 1 <= size <= 1000:
        raise argparse.ArgumentTypeError(f"{size} is outside 1..1000")
    return size


def _retention(value: str, *, never: bool = False) -> timedelta | None:
    try:
        return parse_retention(value, never=never)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _succeeded_retention(value: str) -> timedelta | None:
    return _retention(value, never=True)


def _retention_batch(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if not 1 <= size <= limits.MAX_DELETE_BATCH:
        raise argparse.ArgumentTypeError(f"{size} is outside 1..{limits.MAX_DELETE_BATCH}")
    return size


def _max_waits(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if size < 0:
        raise argparse.ArgumentTypeError(f"{size} is negative")
    return size


def _generation(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    if len(value) > MAX_GENERATION_CHARS:
        raise argparse.ArgumentTypeError(
            f"is {len(value)} characters long, over the limit of {MAX_GENERATION_CHARS}"
        )
    return value


def _default_data_dir() -> pathlib.Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join("~", ".local", "share")
    return pathlib.Path(base, "ringo").expanduser()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ringod",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        type=_listen,
        default=("127.0.0.1", limits.DEFAULT_PORT),
        help=f"address to serve on (default 127.0.0.1:{limits.DEFAULT_PORT});"
        " port 0 picks a free port, reported in the JSON line",
    )
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        type=pathlib.Path,
        help="SQLite storage (the default engine) in DIR, created if missing;"
        " one daemon per DIR (default: $XDG_DATA_HOME/ringo or ~/.local/share/ringo)",
    )
    parser.add_argument(
        "--postgres",
        metavar="DSN",
        help="PostgreSQL storage (a libpq URL or key=value DSN) instead of SQLite;"
        " any number of daemons may share one database. The DSN shows in the"
        f" process list: prefer ${POSTGRES_DSN_ENV}",
    )
    parser.add_argument(
        "--postgres-schema",
        metavar="NAME",
        help="the PostgreSQL schema holding ringod's tables, created if missing (default public)",
    )
    parser.add_argument(
        "--postgres-pool-size",
        metavar="N",
        type=_pool_size,
        help="at most N pooled PostgreSQL connections, plus one for LISTEN"
        f" (default {DEFAULT_POSTGRES_POOL_SIZE}); size every daemon's pool so that all"
        " of them fit the server's max_connections",
    )
    parser.add_argument(
        "--safety-poll",
        metavar="SECONDS",
        type=_non_negative_seconds,
        help="wake every waiting claim and Work stream this often, covering a lost"
        " wake-up from another daemon; 0 turns it off (default"
        f" {DEFAULT_POSTGRES_SAFETY_POLL:g} with PostgreSQL, off with SQLite)",
    )
    auth = parser.add_mutually_exclusive_group()
    auth.add_argument(
        "--token",
        help="require metadata 'authorization: Bearer TOKEN' on every call, health"
        " included; printable ASCII (default: no authentication, unless"
        f" ${TOKEN_ENV} is set). Shows in the process list: prefer --token-file",
    )
    auth.add_argument(
        "--token-file",
        metavar="FILE",
        type=pathlib.Path,
        help="like --token, read from FILE (surrounding whitespace stripped), so the"
        f" secret does not show in the process list; so does ${TOKEN_ENV}",
    )
    parser.add_argument(
        "--auth-failure-delay",
        metavar="SECONDS",
        type=_non_negative_seconds,
        default=DEFAULT_AUTH_FAILURE_DELAY,
        help="slow token guessing down: a call with a wrong or missing token is answered"
        " after a delay doubling from 1/20 of SECONDS up to SECONDS, one at a time per"
        " client address, and its connection is closed after 5 such answers"
        f" (default {DEFAULT_AUTH_FAILURE_DELAY:g}; 0 answers at once)",
    )
    tls = parser.add_argument_group(
        "TLS",
        "serve gRPC over TLS (HTTP/2 negotiated by ALPN; TLS 1.2 or newer) instead of"
        " plaintext; clients then connect with grpcs://",
    )
    tls.add_argument(
        "--tls-cert",
        metavar="FILE",
        type=pathlib.Path,
        help="the server certificate chain (PEM); needs --tls-key",
    )
    tls.add_argument(
        "--tls-key",
        metavar="FILE",
        type=pathlib.Path,
        help="the private key of --tls-cert (PEM, unencrypted)",
    )
    tls.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        type=pathlib.Path,
        help="mutual TLS: require every client to present a certificate issued by a CA"
        " in FILE (PEM bundle); the handshake fails without one",
    )
    shared = parser.add_argument_group(
        "shared mode",
        "one daemon per data dir for several SDK processes, started by whichever"
        " of them wins the election; it stops by itself when nobody uses it",
    )
    shared.add_argument(
        "--local-token-file",
        metavar="FILE",
        type=pathlib.Path,
        help="turn on shared mode: every call, health included, must carry metadata"
        " 'x-ringo-local-token' equal to the secret in FILE (surrounding whitespace"
        " stripped); independent of --token. Needs --generation",
    )
    shared.add_argument(
        "--generation",
        metavar="STR",
        type=_generation,
        help="this shared daemon's identity (1..200 characters): AttachLocal must name"
        " it, and the ready line reports it",
    )
    shared.add_argument(
        "--linger",
        metavar="SECONDS",
        type=_non_negative_seconds,
        help="shut down gracefully once the last member (AttachLocal stream) has been"
        f" gone this long (default {DEFAULT_LINGER:g}; 0: at once)",
    )
    shared.add_argument(
        "--attach-timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        help="shut down gracefully if no member attached within this long of the"
        f" ready line (default {DEFAULT_ATTACH_TIMEOUT:g})",
    )
    parser.add_argument(
        "--protocol-minor",
        metavar="N",
        type=_minor,
        default=versions.MINOR,
        help=f"serve an older protocol minor 0..{versions.MINOR}"
        f" (default {versions.MINOR}, the newest)",
    )
    parser.add_argument(
        "--session-ttl",
        metavar="SECONDS",
        type=_positive_seconds,
        default=limits.DEFAULT_SESSION_TTL.total_seconds(),
        help="lifetime of a negotiated session token"
        f" (default {limits.DEFAULT_SESSION_TTL.total_seconds():g})",
    )
    parser.add_argument(
        "--lifecycle-stdin",
        action="store_true",
        help="shut down gracefully when stdin reaches EOF. For a parent process that"
        " keeps a pipe to the daemon's stdin open: the pipe closes when the parent"
        " dies, so the daemon never outlives it. stdin must then be a pipe or socket."
        " Off by default, so a daemon started by hand (stdin a terminal or /dev/null)"
        " keeps running until SIGTERM/SIGINT.",
    )
    parser.add_argument(
        "--shutdown-timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=5.0,
        help="how long in-flight calls may run after shutdown starts (default 5)",
    )
    parser.add_argument(
        "--heartbeat-interval",
        metavar="SECONDS",
        type=_positive_seconds,
        default=10.0,
        help="a Work stream that has sent nothing for this long sends a heartbeat (default 10)",
    )
    retention = parser.add_argument_group(
        "retention",
        "finished tasks are deleted in the background once they finished this long ago"
        f" (DURATION: 90s, 12h, 7d, 2w, ...; or '{FOREVER}' to keep them)",
    )
    for state, default, parse, also in (
        (
            "succeeded",
            DEFAULT_RETAIN_SUCCEEDED,
            _succeeded_retention,
            f"; '{NEVER}': the ack deletes the task unless a WaitTask waits on it",
        ),
        ("dead", DEFAULT_RETAIN_DEAD, _retention, ""),
        ("cancelled", DEFAULT_RETAIN_CANCELLED, _retention, ""),
    ):
        retention.add_argument(
            f"--retain-{state}",
            metavar="DURATION",
            type=parse,
            default=default,
            help=f"keep {state.upper()} tasks this long"
            f" (default {format_retention(default)}{also})",
        )
    retention.add_argument(
        "--retention-interval",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_RETENTION_INTERVAL,
        help=f"seconds between retention passes (default {DEFAULT_RETENTION_INTERVAL:g})",
    )
    retention.add_argument(
        "--retention-batch",
        metavar="N",
        type=_retention_batch,
        default=None,
        help="tasks deleted per storage transaction; the event loop serves other calls"
        f" between batches (default {DEFAULT_RETENTION_BATCH} with SQLite,"
        f" {DEFAULT_POSTGRES_RETENTION_BATCH} with PostgreSQL)",
    )
    parser.add_argument(
        "--max-waits",
        metavar="N",
        type=_max_waits,
        default=limits.DEFAULT_MAX_WAITS,
        help="WaitTask calls the daemon holds parked at once; one more is answered"
        f" RESOURCE_EXHAUSTED (default {limits.DEFAULT_MAX_WAITS}; each connection holds"
        f" at most {limits.MAX_WAITS_PER_CONNECTION}; 0 refuses every WaitTask)",
    )
    parser.add_argument(
        "--wait-recheck",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_WAIT_RECHECK,
        help="while WaitTask calls are parked, check all their tasks in one query this"
        " often: the safety net under the wake-ups settlements send"
        f" (default {DEFAULT_WAIT_RECHECK:g})",
    )
    parser.add_argument(
        "--idle-timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_IDLE_TIMEOUT,
        help="close (GOAWAY) a client connection that has had no call for this long"
        f" (default {DEFAULT_IDLE_TIMEOUT:g})",
    )
    parser.add_argument(
        "--keepalive-interval",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_KEEPALIVE_INTERVAL,
        help="ping a client connection that has calls this often"
        f" (default {DEFAULT_KEEPALIVE_INTERVAL:g})",
    )
    parser.add_argument(
        "--keepalive-timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_KEEPALIVE_TIMEOUT,
        help="close a client connection whose ping is not acknowledged within this long,"
        f" cancelling its calls (default {DEFAULT_KEEPALIVE_TIMEOUT:g})",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="stderr log level (default info)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="stderr log lines as text (default) or json: one object per line with ts,"
        " level, logger, message, pid and the record's extra fields",
    )
    parser.add_argument(
        "--log-wire",
        action="store_true",
        help="let the gRPC/HTTP/2 libraries (grpclib, h2, hpack) log below WARNING too;"
        " at --log-level debug that is a line per header block (off by default)",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        type=_listen,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default;"
        " 127.0.0.1:9464 is the usual choice, port 0 picks a free one, reported in the"
        ' JSON line as "metrics"). /metrics is plain HTTP without authentication:'
        " keep it on loopback or behind a proxy that guards it",
    )
    parser.add_argument(
        "--ui-listen",
        metavar="HOST:PORT",
        type=_listen,
        help="serve the web dashboard at http://HOST:PORT/ (off by default; port 0 picks a"
        ' free one, reported in the JSON line as "ui"). Plain HTTP: it asks for the'
        " bearer token when one is set; keep it on loopback or behind a TLS proxy",
    )
    parser.add_argument(
        "--ui-read-only",
        action="store_true",
        help="the dashboard shows, never changes: no retry, cancel or purge",
    )
    parser.add_argument(
        "--loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="event loop: uvloop when importable (a dependency of ringo-trio except on"
        " Windows), else asyncio (default auto)",
    )
    parser.add_argument("--version", action="version", version=f"ringod {SDK_VERSION}")
    return parser


@dataclass(frozen=True, slots=True)
class StorageChoice:
    """Where the tasks live: a SQLite data dir, or a PostgreSQL database."""

    data_dir: pathlib.Path | None = None
    postgres_dsn: str | None = field(default=None, repr=False)
    postgres_schema: str = "public"
    postgres_pool_size: int = DEFAULT_POSTGRES_POOL_SIZE

    def open(self) -> Storage:
        if self.postgres_dsn is not None:
            from .storage.postgres import PostgresEngine

            return PostgresEngine(
                self.postgres_dsn, schema=self.postgres_schema, pool_size=self.postgres_pool_size
            )
        from .storage.sqlite import SQLiteEngine

        assert self.data_dir is not None
        return SQLiteEngine(self.data_dir / DB_FILE_NAME)


def storage_choice(args: argparse.Namespace, environ: Mapping[str, str]) -> StorageChoice | str:
    """The storage the flags and environment select, or the usage error.

    An explicit flag beats the environment: ``--postgres`` first, then
    ``--data-dir`` (SQLite), then ``$RINGO_POSTGRES_DSN``, then SQLite in the
    default data dir. So an exported DSN never hijacks a daemon started on a
    data dir (the SDK starts its SQLite daemons that way). A PostgreSQL
    daemon keeps nothing on disk, so naming a data dir with ``--postgres`` is
    refused rather than ignored; so are the shared-mode flags, which are
    about one machine's data dir.
    """
    dsn: str | None = args.postgres
    if dsn is not None and args.data_dir is not None:
        return (
            "--postgres and --data-dir exclude each other (a PostgreSQL daemon keeps no data dir)"
        )
    if dsn is None and args.data_dir is None:
        dsn = environ.get(POSTGRES_DSN_ENV) or None
    if dsn is None:
        for flag, value in (
            ("--postgres-schema", args.postgres_schema),
            ("--postgres-pool-size", args.postgres_pool_size),
        ):
            if value is not None:
                return f"{flag} only applies to PostgreSQL storage"
        data_dir = (args.data_dir or _default_data_dir()).expanduser().absolute()
        return StorageChoice(data_dir=data_dir)
    if not dsn.strip():
        return "--postgres needs a non-empty DSN"
    if args.local_token_file is not None:
        return "shared mode (--local-token-file) is for a SQLite data dir, not PostgreSQL"
    schema = "public" if args.postgres_schema is None else args.postgres_schema
    if not schema or len(schema.encode()) > _MAX_SCHEMA_BYTES:
        return f"--postgres-schema must be 1..{_MAX_SCHEMA_BYTES} bytes long"
    pool_size = args.postgres_pool_size or DEFAULT_POSTGRES_POOL_SIZE
    return StorageChoice(postgres_dsn=dsn, postgres_schema=schema, postgres_pool_size=pool_size)


def _secret_problem(secret: str, where: str) -> str | None:
    """Why `secret` can never be presented by a client, or None.

    A gRPC metadata value is printable ASCII: a daemon started with anything
    else would refuse every client forever, so that is a usage error.
    """
    if not secret:
        return f"{where} is empty"
    if not all(" " <= char <= "~" for char in secret):
        return f"{where} holds a character that is not printable ASCII; no client could send it"
    return None


def _token_problem(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """Settle ``args.token`` from --token, --token-file or the environment
    (in that order); the usage error, or None."""
    if args.token is not None:
        return _secret_problem(args.token, "--token")
    if args.token_file is not None:
        try:
            args.token = args.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            return f"cannot read --token-file {args.token_file}: {exc}"
        return _secret_problem(args.token, f"--token-file {args.token_file}")
    if TOKEN_ENV in environ:
        args.token = environ[TOKEN_ENV].strip()
        return _secret_problem(args.token, f"${TOKEN_ENV}")
    return None


def _tls_problem(args: argparse.Namespace) -> str | None:
    """Build ``args.ssl`` (None: plaintext) from the TLS flags; the usage error, or None."""
    args.ssl = None
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            return "--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS)"
        return None
    if args.tls_cert is None or args.tls_key is None:
        return "--tls-cert and --tls-key go together"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # gRPC is HTTP/2, which a TLS client negotiates through ALPN.
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        return f"cannot load --tls-cert {args.tls_cert} / --tls-key {args.tls_key}: {exc}"
    if args.tls_client_ca is not None:
        try:
            context.load_verify_locations(cafile=args.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            return f"cannot load --tls-client-ca {args.tls_client_ca}: {exc}"
        context.verify_mode = ssl.CERT_REQUIRED
    args.ssl = context
    return None


def _shared_mode_problem(args: argparse.Namespace) -> str | None:
    """Check the shared-mode flags and read the local token into
    ``args.local_token``; the usage error, or None."""
    args.local_token = None
    if args.local_token_file is None:
        given = [
            flag
            for flag, value in (
                ("--generation", args.generation),
                ("--linger", args.linger),
                ("--attach-timeout", args.attach_timeout),
            )
            if value is not None
        ]
        if given:
            return f"{', '.join(given)} only applies to a shared daemon (--local-token-file)"
        return None
    if args.generation is None:
        return "--local-token-file needs --generation (the shared daemon's identity)"
    try:
        secret = args.local_token_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read --local-token-file {args.local_token_file}: {exc}"
    problem = _secret_problem(secret, f"--local-token-file {args.local_token_file}")
    args.local_token = secret
    return problem


def settle(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """Settle ``args.token``, ``args.ssl`` and ``args.local_token`` from the
    flags and `environ`; the usage error, or None."""
    return _token_problem(args, environ) or _tls_problem(args) or _shared_mode_problem(args)
