"""Endpoint resolution: defaults, the private directory, derived endpoints and the bind-address check."""

import os
import stat

import pytest

from mlxd_protocol.endpoints import (
    MAX_IPC_PATH_BYTES,
    check_bind_address,
    default_endpoint,
    ensure_private_dir,
    parse_endpoint,
    pid_file,
    socket_path,
    trace_endpoint,
)

MALFORMED = [
    "",
    "mlxd.sock",
    "http://127.0.0.1:80",
    "ipc://",
    "ipc://relative/mlxd.sock",
    "tcp://127.0.0.1",
    "tcp://127.0.0.1:",
    "tcp://127.0.0.1:http",
    "tcp://:5555",
    "tcp://127.0.0.1:0",
    "tcp://127.0.0.1:70000",
    "tcp://::1:5555",
    "tcp://[not-v6]:5555",
    "tcp://host name:5555",
]


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("MLXD_ENDPOINT", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return monkeypatch


def test_env_var_overrides_the_default(clean_env):
    clean_env.setenv("MLXD_ENDPOINT", "tcp://127.0.0.1:7000")
    assert default_endpoint() == "tcp://127.0.0.1:7000"


def test_malformed_env_var_is_reported_by_name(clean_env):
    clean_env.setenv("MLXD_ENDPOINT", "http://nope")
    with pytest.raises(ValueError, match=r"\$MLXD_ENDPOINT"):
        default_endpoint()


def test_default_uses_xdg_runtime_dir_when_writable(clean_env, tmp_path):
    clean_env.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_endpoint() == f"ipc://{tmp_path}/mlxd/mlxd.sock"


def test_default_falls_back_to_a_per_user_tmp_dir(clean_env, tmp_path):
    assert default_endpoint() == f"ipc:///tmp/mlxd-{os.getuid()}/mlxd.sock"
    clean_env.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert default_endpoint() == f"ipc:///tmp/mlxd-{os.getuid()}/mlxd.sock"


def test_private_dir_is_created_with_mode_0700(tmp_path):
    directory = ensure_private_dir(f"ipc://{tmp_path}/a/b/mlxd.sock")
    assert directory == tmp_path / "a" / "b"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


def test_existing_private_dir_gets_its_mode_fixed(tmp_path):
    directory = tmp_path / "run"
    directory.mkdir()
    directory.chmod(0o755)
    ensure_private_dir(f"ipc://{directory}/mlxd.sock")
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


def test_tcp_endpoints_get_the_default_private_dir(clean_env, tmp_path):
    clean_env.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert ensure_private_dir("tcp://127.0.0.1:7000") == tmp_path / "mlxd"
    assert pid_file("tcp://127.0.0.1:7000") == tmp_path / "mlxd" / "mlxd-tcp-7000.pid"


def test_shared_sticky_dir_is_refused_not_chmodded(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(PermissionError, match="shared directory"):
        ensure_private_dir(f"ipc://{shared}/mlxd.sock")
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777


def test_symlinked_dir_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ValueError, match="not a directory"):
        ensure_private_dir(f"ipc://{tmp_path}/link/mlxd.sock")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another user")
def test_dir_owned_by_another_user_is_refused(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o755)
    os.chown(foreign, 12345, 12345)
    with pytest.raises(PermissionError, match="uid 12345"):
        ensure_private_dir(f"ipc://{foreign}/mlxd.sock")
    assert stat.S_IMODE(os.stat(foreign).st_mode) == 0o755


@pytest.mark.parametrize(
    "endpoint, expected",
    [
        ("ipc:///run/user/1000/mlxd/mlxd.sock", "ipc:///run/user/1000/mlxd/mlxd.ticks.sock"),
        ("ipc:///tmp/x/other", "ipc:///tmp/x/other.ticks"),
        ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"),
        ("tcp://[::1]:7000", "tcp://[::1]:7001"),
    ],
)
def test_trace_endpoint_derivation(endpoint, expected):
    assert trace_endpoint(endpoint) == expected


def test_trace_endpoint_needs_a_next_port():
    with pytest.raises(ValueError, match="65535"):
        trace_endpoint("tcp://127.0.0.1:65535")


def test_pid_file_and_socket_path_for_ipc(tmp_path):
    assert pid_file(f"ipc://{tmp_path}/mlxd.sock") == tmp_path / "mlxd.pid"
    assert pid_file(f"ipc://{tmp_path}/custom") == tmp_path / "custom.pid"
    assert socket_path(f"ipc://{tmp_path}/mlxd.sock") == tmp_path / "mlxd.sock"
    assert socket_path("tcp://127.0.0.1:5555") is None


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://127.0.0.1:5555",
        "tcp://127.9.9.9:5555",
        "tcp://localhost:5555",
        "tcp://[::1]:5555",
        "ipc:///tmp/mlxd-0/mlxd.sock",
    ],
)
def test_loopback_and_ipc_endpoints_may_be_bound(endpoint):
    check_bind_address(endpoint, allow_public=False)


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://0.0.0.0:5555", "tcp://10.1.2.3:5555", "tcp://*:5555", "tcp://example.com:5555", "tcp://[::]:5555"],
)
def test_public_addresses_need_allow_public(endpoint):
    with pytest.raises(ValueError, match="--allow-public"):
        check_bind_address(endpoint, allow_public=False)
    check_bind_address(endpoint, allow_public=True)


def test_overlong_socket_paths_are_refused():
    path = "/tmp/" + "x" * MAX_IPC_PATH_BYTES
    with pytest.raises(ValueError, match="shorter path"):
        check_bind_address(f"ipc://{path}")


@pytest.mark.parametrize("endpoint", MALFORMED)
def test_malformed_endpoints_are_refused_everywhere(endpoint):
    for use in (parse_endpoint, trace_endpoint, pid_file, socket_path, check_bind_address):
        with pytest.raises(ValueError, match="endpoint"):
            use(endpoint)
