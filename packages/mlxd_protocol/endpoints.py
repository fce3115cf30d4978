"""Where the daemon listens: endpoint defaults, derived endpoints and paths, bind-address checks.

Contract:
    * Only ``ipc://<absolute path>`` and ``tcp://<host>:<port>`` endpoints exist; anything else
      raises ``ValueError`` saying what a valid endpoint looks like. IPv6 hosts are bracketed.
    * ``default_endpoint()`` is ``$MLXD_ENDPOINT`` when set, else an ipc socket in a per-user
      private directory: ``$XDG_RUNTIME_DIR/mlxd/mlxd.sock``, or ``/tmp/mlxd-<uid>/mlxd.sock``.
    * Everything else derives from the endpoint: the tick-trace PUB endpoint, the pid file.
    * Only ``ensure_private_dir`` touches the file system (creating / tightening a directory);
      the rest are pure functions of the endpoint and the environment.
    * The protocol has no authentication, so a daemon may listen on tcp only on loopback unless
      the operator passes ``--allow-public``: ``check_bind_address`` enforces that.
"""

import ipaddress
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

ENDPOINT_ENV = "MLXD_ENDPOINT"
SOCKET_NAME = "mlxd.sock"
TICKS_SUFFIX = ".ticks.sock"
# sun_path holds 108 bytes on Linux and 104 on macOS, both counting the final NUL.
MAX_IPC_PATH_BYTES = 103
_PORT = re.compile(r"[0-9]{1,5}")
_VALID_FORMS = "ipc:///absolute/path/mlxd.sock or tcp://127.0.0.1:PORT"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A parsed endpoint: ``path`` is set for ipc, ``host`` and ``port`` for tcp."""

    scheme: str
    path: Path | None = None
    host: str | None = None
    port: int | None = None


def parse_endpoint(endpoint: str) -> Endpoint:
    """Split an endpoint string into its parts.

    Args:
        endpoint: ``ipc://<absolute path>`` or ``tcp://<host>:<port>`` (IPv6 as ``[addr]``).

    Returns:
        The parsed ``Endpoint``.

    Raises:
        ValueError: The string is not one of those two forms.
    """
    scheme, separator, rest = str(endpoint).partition("://")
    if not separator or scheme not in ("ipc", "tcp"):
        raise ValueError(f"unsupported endpoint {endpoint!r}: use {_VALID_FORMS}")
    if scheme == "ipc":
        # A relative path would depend on each process's working directory.
        if not rest.startswith("/"):
            raise ValueError(f"ipc endpoint {endpoint!r} needs an absolute socket path, e.g. ipc:///tmp/x/mlxd.sock")
        return Endpoint("ipc", path=Path(rest))
    host, separator, port_text = rest.rpartition(":")
    if not separator or not host or not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"tcp endpoint {endpoint!r} must be tcp://HOST:PORT with PORT in 1..65535")
    if host.startswith("[") or host.endswith("]"):
        try:
            ipaddress.IPv6Address(host.removeprefix("[").removesuffix("]"))
        except ValueError:
            raise ValueError(f"tcp endpoint {endpoint!r}: {host} is not a bracketed IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"tcp endpoint {endpoint!r}: write IPv6 addresses in brackets, e.g. tcp://[::1]:PORT")
    if any(char.isspace() or char == "/" for char in host):
        raise ValueError(f"tcp endpoint {endpoint!r}: {host!r} is not a host name or address")
    return Endpoint("tcp", host=host, port=int(port_text))


def default_private_dir() -> Path:
    """The per-user directory for sockets and pid files.

    Returns:
        ``$XDG_RUNTIME_DIR/mlxd`` when that runtime directory exists and is writable, else
        ``/tmp/mlxd-<uid>`` (not ``tempfile.gettempdir()``: macOS's per-user temp path is long
        enough to push a socket path past the OS limit).
    """
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime_dir and os.path.isdir(runtime_dir) and os.access(runtime_dir, os.W_OK | os.X_OK):
        return Path(runtime_dir) / "mlxd"
    return Path("/tmp") / f"mlxd-{os.getuid()}"


def default_endpoint() -> str:
    """The endpoint daemon and clients use when none is given.

    Returns:
        ``$MLXD_ENDPOINT`` if set (and non-empty), else ``ipc://<private dir>/mlxd.sock``.

    Raises:
        ValueError: ``$MLXD_ENDPOINT`` is set but malformed (the message names the variable).
    """
    configured = os.environ.get(ENDPOINT_ENV, "").strip()
    if configured:
        try:
            parse_endpoint(configured)
        except ValueError as error:
            raise ValueError(f"${ENDPOINT_ENV}: {error}") from None
        return configured
    return f"ipc://{default_private_dir() / SOCKET_NAME}"


def socket_path(endpoint: str) -> Path | None:
    """The socket file of an ipc endpoint.

    Args:
        endpoint: An endpoint string.

    Returns:
        The socket's path for ipc, None for tcp.

    Raises:
        ValueError: The endpoint is malformed.
    """
    return parse_endpoint(endpoint).path


def ensure_private_dir(endpoint: str) -> Path:
    """Create (or tighten) the directory that holds the endpoint's socket and pid file.

    The directory ends up owned by us with mode 0700, so other users can neither connect to the
    socket nor plant one of their own where our clients look.

    Args:
        endpoint: An ipc endpoint (its socket's directory) or tcp endpoint (the default private dir).

    Returns:
        The directory.

    Raises:
        ValueError: The endpoint is malformed, or the path is not a real directory (e.g. a symlink).
        PermissionError: Another user owns the directory, or it is a shared sticky directory
            such as /tmp itself (which we must not make private).
    """
    parsed = parse_endpoint(endpoint)
    directory = parsed.path.parent if parsed.path is not None else default_private_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{directory} is not a directory (a symlink or a file); remove it or choose another path")
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"{directory} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}); refusing to use it. "
            f"Remove it or set {ENDPOINT_ENV} to a socket in a directory you own."
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        if info.st_mode & stat.S_ISVTX:
            raise PermissionError(
                f"{directory} is a shared directory (sticky bit set); put the socket in a private "
                f"subdirectory, e.g. ipc://{directory / f'mlxd-{os.getuid()}' / SOCKET_NAME}"
            )
        os.chmod(directory, 0o700)
    return directory


# With an auth token the trace socket is a ZeroMQ PLAIN server: subscribers log in as this user, with the
# daemon's auth token as the password (the request socket's Hello carries the same token).
TRACE_USER = "mlxd"


def trace_endpoint(endpoint: str) -> str:
    """The PUB endpoint on which the daemon publishes its tick trace.

    Args:
        endpoint: The daemon's request endpoint.

    Returns:
        For ``ipc://…/mlxd.sock``: ``ipc://…/mlxd.ticks.sock`` (any other name gets ``.ticks``
        appended); for ``tcp://host:port``: ``tcp://host:<port + 1>``.

    Raises:
        ValueError: The endpoint is malformed, or its tcp port is 65535 (no port above it).
    """
    parsed = parse_endpoint(endpoint)
    if parsed.path is not None:
        name = parsed.path.name
        trace_name = name.removesuffix(".sock") + TICKS_SUFFIX if name.endswith(".sock") else name + ".ticks"
        return f"ipc://{parsed.path.with_name(trace_name)}"
    assert parsed.port is not None  # tcp: host and port are set
    if parsed.port == 65535:
        raise ValueError(f"{endpoint}: the tick trace uses the next port, and 65535 is the last one")
    return f"tcp://{parsed.host}:{parsed.port + 1}"


def pid_file(endpoint: str) -> Path:
    """Where the daemon serving ``endpoint`` writes its pid.

    Args:
        endpoint: The daemon's request endpoint.

    Returns:
        Beside an ipc socket, with ``.sock`` replaced by ``.pid`` (``mlxd.sock`` -> ``mlxd.pid``);
        for tcp, ``mlxd-tcp-<port>.pid`` in the default private directory.

    Raises:
        ValueError: The endpoint is malformed.
    """
    parsed = parse_endpoint(endpoint)
    if parsed.path is None:
        return default_private_dir() / f"mlxd-tcp-{parsed.port}.pid"
    name = parsed.path.name
    return parsed.path.with_name(name.removesuffix(".sock") + ".pid" if name.endswith(".sock") else name + ".pid")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        # A host name other than localhost could resolve anywhere: not provably loopback.
        return False


def check_bind_address(endpoint: str, allow_public: bool = False) -> None:
    """Refuse endpoints a daemon must not bind.

    Args:
        endpoint: The endpoint the daemon is about to bind.
        allow_public: The operator passed ``--allow-public``: any tcp address is allowed.

    Raises:
        ValueError: The endpoint is malformed; an ipc socket path is longer than the OS allows;
            or a tcp host is not loopback (127.0.0.0/8, ::1, localhost) and ``allow_public`` is
            false (the message names ``--allow-public``).
    """
    parsed = parse_endpoint(endpoint)
    if parsed.path is not None:
        length = len(os.fsencode(parsed.path))
        if length > MAX_IPC_PATH_BYTES:
            raise ValueError(
                f"{endpoint}: the socket path is {length} bytes, the OS allows "
                f"{MAX_IPC_PATH_BYTES}; choose a shorter path ({ENDPOINT_ENV})"
            )
        return
    assert parsed.host is not None  # tcp: host and port are set
    if not allow_public and not _is_loopback(parsed.host):
        raise ValueError(
            f"refusing to listen on {endpoint}: {parsed.host} is not a loopback address and the protocol "
            f"has no authentication. Use 127.0.0.1, ::1 or localhost, or pass --allow-public to expose it."
        )
