"""Local Triton lifecycle: config validation and error messages without a server, then a real
tritonserver (from the nvidia-pytriton wheel) with a throwaway python-backend model repository.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from seqcls.errors import InputError, ServingError
from seqcls.localtriton import (
    LocalTriton,
    TritonDistribution,
    TritonServerConfig,
    find_libpython,
    free_port,
    free_ports,
    wait_until_live,
)
from seqcls.localtriton.distribution import server_environment
from seqcls.localtriton.keys import ensure_key, masked
from seqcls.settings import Settings

# ----------------------------------------------------------------------------- helpers

ECHO_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "SYS_PATH" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# model.py imports a sibling module shipped in the same version directory (1/helper.py), the
# way seqcls ships shared helpers next to model.py. It also returns its sys.path for the test.
ECHO_MODEL = """
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

import helper


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            paths = np.array([[json.dumps(sys.path).encode()]] * x.shape[0], dtype=object)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", helper.double(x)), pb_utils.Tensor("SYS_PATH", paths)]
                )
            )
        return responses
"""

HELPER = """
def double(x):
    return (x * 2).astype(x.dtype)
"""

BROKEN_MODEL = "raise RuntimeError('this model is broken on purpose')\n"


def write_repository(root: Path) -> Path:
    """A model repository with a working ``echo`` model and a ``broken`` one that fails to load."""
    for name, model in (("echo", ECHO_MODEL), ("broken", BROKEN_MODEL)):
        version = root / name / "1"
        version.mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(ECHO_CONFIG)
        (version / "model.py").write_text(textwrap.dedent(model))
        (version / "helper.py").write_text(textwrap.dedent(HELPER))
    return root


def make_config(repository: Path, state_dir: Path, **overrides: object) -> TritonServerConfig:
    http, grpc, metrics = free_ports(3)
    values: dict[str, object] = {
        "repository": repository,
        "state_dir": state_dir,
        "http_port": http,
        "grpc_port": grpc,
        "metrics_port": metrics,
        "startup_timeout": 30.0,
    }
    values.update(overrides)
    return TritonServerConfig(**values)  # type: ignore[arg-type]


def server_processes(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Processes still running; a zombie waiting for init to reap it counts as gone."""
    result = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                result.append(proc)
        except psutil.NoSuchProcess:
            pass
    return result


def processes_mentioning(path: Path) -> list[psutil.Process]:
    """Any process whose command line names ``path`` (server or stub, even if reparented)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(str(path) in arg for arg in cmdline):
            found.append(proc)
    return found


def shm_regions(prefix: str) -> list[Path]:
    return sorted(Path("/dev/shm").glob(prefix + "*"))


def infer_grpc(url: str, data: np.ndarray) -> tuple[np.ndarray, list[str]]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        result = client.infer("echo", [inp])
        return result.as_numpy("OUTPUT0"), json.loads(result.as_numpy("SYS_PATH")[0][0])
    finally:
        client.close()


def infer_http(url: str, data: np.ndarray) -> np.ndarray:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data, binary_data=False)
        return client.infer("echo", [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


# ----------------------------------------------------------------------------- unit tests


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"http_port": 0}, "http_port=0"),
        ({"grpc_port": 70000}, "grpc_port=70000"),
        ({"metrics_port": "8002"}, "metrics_port='8002'"),
        ({"http_port": True}, "http_port=True"),
        ({"http_port": 9000, "grpc_port": 9000}, "ports must differ"),
        ({"host": "0.0.0.0"}, "not a loopback address"),
        ({"host": "10.1.2.3"}, "not a loopback address"),
        ({"extra_args": ("--http-port=1234",)}, "may not set --http-port"),
        ({"extra_args": ("--model-repository", "/x")}, "may not set --model-repository"),
        ({"extra_args": "--log-info=true"}, "sequence of strings"),
        ({"extra_args": ("--grpc-restricted-protocol=health:k=v",)}, "may not set --grpc-restricted-protocol"),
        ({"control_key": "too-short"}, "control_key: the Triton control key must be 16-512"),
        ({"control_key": "x" * 20 + " y"}, "control_key"),
        ({"startup_timeout": 0}, "startup_timeout"),
        ({"shm_default_byte_size": 0}, "shm_default_byte_size"),
        ({"log_verbose": -1}, "log_verbose"),
    ],
)
def test_config_rejects_bad_values(tmp_path: Path, overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        TritonServerConfig(tmp_path, **overrides)  # type: ignore[arg-type]


def test_config_normalises_and_allows_remote_deliberately(tmp_path: Path) -> None:
    cfg = TritonServerConfig(tmp_path / "repo", host="localhost", state_dir=tmp_path / "state")
    assert cfg.host == "127.0.0.1"
    assert cfg.repository.is_absolute() and cfg.state_dir == (tmp_path / "state").resolve()
    assert (cfg.http_url, cfg.grpc_url, cfg.metrics_url) == (
        "127.0.0.1:8000",
        "127.0.0.1:8001",
        "127.0.0.1:8002",
    )
    wide = TritonServerConfig(tmp_path, host="0.0.0.0", allow_remote=True)
    assert wide.http_url == "127.0.0.1:8000"  # clients reach a wildcard bind on loopback
    v6 = TritonServerConfig(tmp_path, host="::1")
    assert v6.grpc_url == "[::1]:8001"


def test_config_from_settings(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, triton_http=("127.0.0.1:9100",), triton_grpc=("localhost:9101",))
    cfg = TritonServerConfig.from_settings(settings, metrics_port=9102, log_verbose=None)
    assert cfg.repository == settings.triton_repository
    assert cfg.state_dir == settings.triton_dir
    assert (cfg.http_port, cfg.grpc_port, cfg.metrics_port, cfg.log_verbose) == (9100, 9101, 9102, 0)

    defaults = TritonServerConfig.from_settings(Settings(home=tmp_path))
    assert (defaults.http_port, defaults.grpc_port, defaults.metrics_port) == (8000, 8001, 8002)

    remote = Settings(home=tmp_path, triton_http=("triton-0:8000",), triton_grpc=("triton-0:8001",))
    with pytest.raises(InputError, match="not on this machine"):
        TritonServerConfig.from_settings(remote)
    with pytest.raises(TypeError, match="unknown"):
        TritonServerConfig.from_settings(settings, http=1)


KEY = "k3y-" + "0123456789abcdef" * 2


def test_command_restricts_model_control_to_the_key_and_logs_it_masked(tmp_path: Path) -> None:
    cfg = TritonServerConfig(tmp_path / "repo", state_dir=tmp_path / "state", control_key=KEY)
    argv = cfg.command(tmp_path / "server", "seqcls-00000000-")
    apis = "model-repository,shared-memory,trace,logging"
    assert f"--http-restricted-api={apis}:triton-control-key={KEY}" in argv
    assert f"--grpc-restricted-protocol={apis}:triton-control-key={KEY}" in argv
    assert KEY not in repr(cfg) and KEY not in " ".join(masked(argv, KEY)) and "***" in " ".join(masked(argv, KEY))
    with pytest.raises(InputError, match="no Triton control key"):
        TritonServerConfig(tmp_path / "repo").command(tmp_path / "server", "seqcls-00000000-")
    settings = Settings(home=tmp_path, triton_control_key=KEY)
    assert TritonServerConfig.from_settings(settings).control_key == KEY
    assert KEY not in repr(settings)
    assert TritonServerConfig.from_settings(Settings(home=tmp_path)).control_key is None  # the key file decides


def test_key_file_is_generated_once_private_and_found_by_settings(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    settings = Settings(home=tmp_path, triton_repository=repo)
    assert settings.control_key() is None
    key = ensure_key(repo)
    path = repo / ".seqcls-triton-control-key"
    assert path.stat().st_mode & 0o777 == 0o600
    assert ensure_key(repo) == key == settings.control_key() and len(key) >= 32
    assert [p.name for p in repo.iterdir()] == [path.name], "no temporary left behind"
    assert Settings(home=tmp_path, triton_repository=repo, triton_control_key=KEY).control_key() == KEY  # explicit wins
    path.chmod(0o644)
    with pytest.raises(InputError, match=r"readable by others .*chmod 600"):
        ensure_key(repo)
    with pytest.raises(InputError, match="SEQCLS_TRITON_CONTROL_KEY / the Triton Connection's password"):
        Settings(home=tmp_path, triton_control_key="short")


def test_server_environment_does_not_carry_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQCLS_TRITON_CONTROL_KEY", KEY)
    env = server_environment(TritonDistribution.locate(), find_libpython())
    assert "SEQCLS_TRITON_CONTROL_KEY" not in env and KEY not in env.values()


def test_missing_binary_names_the_install_command(tmp_path: Path) -> None:
    fake_root = tmp_path / "site-packages" / "pytriton"
    (fake_root / "tritonserver" / "bin").mkdir(parents=True)
    with pytest.raises(ServingError, match=r"tritonserver binary not found.*pip install 'nvidia-pytriton==0\.7\.0'"):
        TritonDistribution.locate(fake_root)


def test_pytriton_not_installed_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ServingError, match=r"nvidia-pytriton is not installed.*pip install"):
        TritonDistribution.locate()


def test_missing_stub_for_this_python(tmp_path: Path) -> None:
    root = tmp_path / "site-packages" / "pytriton"
    (root / "tritonserver" / "bin").mkdir(parents=True)
    (root / "tritonserver" / "bin" / "tritonserver").write_text("")
    (root / "tritonserver" / "python_backend_stubs" / "3.8").mkdir(parents=True)
    (tmp_path / "site-packages" / "nvidia_pytriton.libs").mkdir()
    with pytest.raises(ServingError, match=r"no python backend stub for Python 3\.\d+ \(it has: 3\.8\)"):
        TritonDistribution.locate(root)


def test_missing_libpython_names_the_package(tmp_path: Path) -> None:
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    with pytest.raises(ServingError, match=rf"apt-get install libpython{minor}"):
        find_libpython(tmp_path, search_system=False)


def test_libpython_of_this_interpreter_is_found() -> None:
    assert find_libpython().name.startswith(f"libpython{sys.version_info.major}.{sys.version_info.minor}")


def test_status_and_stop_of_a_server_that_is_not_running(tmp_path: Path) -> None:
    srv = LocalTriton(TritonServerConfig(tmp_path / "repo", state_dir=tmp_path / "state"))
    status = srv.status()
    assert (status.running, status.pid, status.live, status.ready, status.version) == (
        False,
        None,
        False,
        False,
        None,
    )
    assert status.detail == "not running"
    assert json.loads(json.dumps(status.to_dict()))["log_path"].endswith("tritonserver.log")
    srv.stop()  # no-op, no error
    assert srv.log_tail() == ""


def test_stale_pid_file_is_not_reported_as_running(tmp_path: Path) -> None:
    srv = LocalTriton(TritonServerConfig(tmp_path / "repo", state_dir=tmp_path))
    me = psutil.Process()  # alive, but not a tritonserver: a reused pid must not count
    srv.state_path.write_text(json.dumps({"pid": me.pid, "create_time": me.create_time()}))
    srv.pid_path.write_text(f"{me.pid}\n")
    status = srv.status()
    assert not status.running and "stale pid file" in status.detail
    srv.stop()
    assert not srv.pid_path.exists() and not srv.state_path.exists()


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))


def test_log_tail(tmp_path: Path) -> None:
    srv = LocalTriton(TritonServerConfig(tmp_path, state_dir=tmp_path))
    srv.log_path.write_text("".join(f"line {i}\n" for i in range(5000)))
    assert srv.log_tail(3) == "line 4997\nline 4998\nline 4999"


def test_wait_until_live_fails_fast_when_the_process_exits(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    log_file.write_text("E0101 main.cc] \"failed to start GRPC service: Socket '127.0.0.1:8001' already in use\"\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    start = time.monotonic()
    with pytest.raises(ServingError, match=r"exited with code 3.*port 8001 is already in use") as err:
        wait_until_live(f"127.0.0.1:{free_port()}", 30, process=proc, log_path=log_file)
    assert time.monotonic() - start < 5
    assert "failed to start GRPC service" in str(err.value)


def test_wait_until_live_times_out(tmp_path: Path) -> None:
    with pytest.raises(ServingError, match="not live after"):
        wait_until_live(f"127.0.0.1:{free_port()}", 0.3)


def test_port_in_use_is_refused_before_starting(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "repo", tmp_path / "state")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", cfg.grpc_port))
        busy.listen()
        with pytest.raises(ServingError, match=rf"port {cfg.grpc_port} \(Triton gRPC\) on 127.0.0.1 is already in use"):
            LocalTriton(cfg).start()
    assert not LocalTriton(cfg).pid_path.exists()


def test_a_port_held_by_a_socket_that_is_not_listening_is_waited_for(tmp_path: Path) -> None:
    """The CI failure on a restart after a crash: the port was held by no listener (nothing named) —
    a socket bound but not listening, as another process's free-port probe or a server between bind
    and listen holds it for moments. Such a holder is waited for, not reported as a busy port."""
    import threading

    from seqcls.localtriton.ports import check_ports_free

    cfg = make_config(tmp_path / "repo", tmp_path / "state")
    held = socket.socket()
    held.bind(("127.0.0.1", cfg.http_port))  # no SO_REUSEADDR, not listening: Triton could not bind either
    timer = threading.Timer(0.5, held.close)
    timer.start()
    try:
        check_ports_free(cfg, wait=20.0)
    finally:
        timer.cancel()
        held.close()


def test_a_port_held_past_the_wait_names_what_holds_it(tmp_path: Path) -> None:
    from seqcls.localtriton.ports import check_ports_free

    cfg = make_config(tmp_path / "repo", tmp_path / "state")
    with socket.socket() as held:
        held.bind(("127.0.0.1", cfg.http_port))
        with pytest.raises(ServingError, match=r"bound but not listening.*waited 0\.3 s") as err:
            check_ports_free(cfg, wait=0.3)
    assert f"port {cfg.http_port} (Triton HTTP)" in str(err.value)
    with socket.create_server(("127.0.0.1", 0)) as server, socket.socket() as conn:
        conn.bind(("127.0.0.1", cfg.grpc_port))  # a connection whose local port is Triton's gRPC port
        conn.connect(server.getsockname())
        me = re.escape(f"pid {os.getpid()} ({psutil.Process().name()})")
        connection = rf"held by {me}, a connection in state ESTABLISHED"
        with pytest.raises(ServingError, match=connection):
            check_ports_free(cfg, wait=0.3)


def test_a_port_with_a_listener_fails_at_once_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.localtriton import ports

    cfg = make_config(tmp_path / "repo", tmp_path / "state")
    slept: list[float] = []
    monkeypatch.setattr(ports.time, "sleep", slept.append)
    listener = rf"port {cfg.metrics_port} \(Triton metrics\).*by pid {os.getpid()}"
    with socket.create_server(("127.0.0.1", cfg.metrics_port)), pytest.raises(ServingError, match=listener):
        ports.check_ports_free(cfg, wait=30.0)
    assert slept == []  # a listener stays: nothing to wait for


def test_free_ports_are_outside_the_kernels_ephemeral_range() -> None:
    """Ports the kernel hands to bind(0) and connect() are the ones other processes take without
    asking; test and demo servers restarted on their ports stay clear of them."""
    from seqcls.localtriton.ports import ephemeral_range

    low, high = ephemeral_range()
    assert 1024 < low <= high
    ports = free_ports(20)
    assert len(set(ports)) == 20
    if low > 1024 + 2000:
        assert all(1024 <= p < low for p in ports), (ports, low)


# ----------------------------------------------------------------------------- real server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    root = tmp_path_factory.mktemp("triton")
    cfg = make_config(write_repository(root / "repo"), root / "state")
    srv = LocalTriton(cfg)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


@pytest.mark.integration
@pytest.mark.slow
def test_start_status_and_idempotent_start(server: LocalTriton) -> None:
    status = server.status()
    assert status.running and status.live and status.ready
    assert status.version == "2.51.0"
    assert status.grpc_url == server.config.grpc_url
    assert psutil.Process(status.pid).name() == "tritonserver"
    assert json.loads(json.dumps(status.to_dict()))["pid"] == status.pid

    again = LocalTriton(server.config).start()  # another process/CLI call with the same config
    assert again.pid == status.pid and again.detail.startswith("already running")


@pytest.mark.integration
@pytest.mark.slow
def test_start_with_other_ports_on_the_same_state_dir_is_refused(server: LocalTriton) -> None:
    other = make_config(server.config.repository, server.config.state_dir)
    with pytest.raises(ServingError, match=r"already runs from .*Stop it first"):
        LocalTriton(other).start()
    assert "different configuration" in LocalTriton(other).status().detail


@pytest.mark.integration
@pytest.mark.slow
def test_load_and_infer_over_grpc_and_http_with_a_sibling_module(server: LocalTriton) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.load_model("echo", headers=server.control_headers())
        assert client.is_model_ready("echo")
    finally:
        client.close()
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    doubled, sys_path = infer_grpc(server.grpc_url, data)
    np.testing.assert_array_equal(doubled, data * 2)  # computed by 1/helper.py
    np.testing.assert_array_equal(infer_http(server.http_url, data), data * 2)
    # The python backend puts the version dir (and the model dir) on sys.path; "" is the
    # server's cwd, which LocalTriton sets to state_dir.
    version_dir = str(server.config.repository / "echo" / "1")
    assert version_dir in sys_path and str(server.config.repository / "echo") in sys_path
    assert str(Path(sys.prefix) / "lib") in " ".join(sys_path)  # this venv's site-packages


@pytest.mark.integration
@pytest.mark.slow
def test_failed_load_does_not_poison_server_readiness(server: LocalTriton) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="broken on purpose"):
            client.load_model("broken", headers=server.control_headers())
        assert not client.is_model_ready("broken")
        assert client.is_server_ready()  # --strict-readiness=false
        assert "broken on purpose" in server.log_tail(200)

        client.load_model("echo", headers=server.control_headers())
        client.unload_model("echo", headers=server.control_headers())  # asynchronous: poll until it is gone
        assert wait_for(lambda: not client.is_model_ready("echo"))
        assert client.is_server_ready()
    finally:
        client.close()


@pytest.mark.integration
@pytest.mark.slow
def test_context_manager_stop_leaves_no_process_or_shm(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient

    cfg = make_config(write_repository(tmp_path / "repo"), tmp_path / "state")
    with LocalTriton(cfg) as srv:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        client.load_model("echo", headers=srv.control_headers())
        client.close()
        procs = server_processes(srv.status().pid)  # server + one python stub
        assert any("triton_python_backend_stub" in " ".join(p.cmdline()) for p in procs)
        prefix = json.loads(srv.state_path.read_text())["shm_prefix"]
        assert shm_regions(prefix)
    assert not alive(procs)
    assert not processes_mentioning(cfg.state_dir)
    assert not shm_regions(prefix)
    assert not srv.pid_path.exists() and not srv.status().running


@pytest.mark.integration
@pytest.mark.slow
def test_stop_falls_back_to_sigkill_and_cleans_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import tritonclient.grpc as grpcclient

    cfg = make_config(write_repository(tmp_path / "repo"), tmp_path / "state")
    srv = LocalTriton(cfg)
    srv.start()
    try:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        client.load_model("echo", headers=srv.control_headers())
        client.close()
        procs = server_processes(srv.status().pid)
        prefix = json.loads(srv.state_path.read_text())["shm_prefix"]
        with caplog.at_level(logging.WARNING, logger="seqcls.localtriton"):
            srv.stop(timeout=0)  # no grace period: SIGKILL right after SIGTERM
        assert "SIGKILL" in caplog.text
    finally:
        srv.stop()
    assert not alive(procs)
    assert not processes_mentioning(cfg.state_dir)
    assert not shm_regions(prefix)  # a killed server cannot clean up; stop() does


@pytest.mark.integration
@pytest.mark.slow
def test_server_that_dies_at_startup_fails_fast_with_its_log(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "repo", tmp_path / "state", extra_args=("--no-such-flag",))
    srv = LocalTriton(cfg)
    start = time.monotonic()
    with pytest.raises(ServingError, match="exited with code") as err:
        srv.start()
    assert time.monotonic() - start < 10
    assert "unrecognized option '--no-such-flag'" in str(err.value)
    assert not srv.pid_path.exists() and not srv.status().running


@pytest.mark.integration
@pytest.mark.slow
def test_restart_after_a_crash_cleans_orphans_and_shm(tmp_path: Path) -> None:
    import os
    import signal

    import tritonclient.grpc as grpcclient

    cfg = make_config(write_repository(tmp_path / "repo"), tmp_path / "state")
    srv = LocalTriton(cfg)
    first = srv.start()
    try:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        client.load_model("echo", headers=srv.control_headers())
        client.close()
        stubs = server_processes(first.pid)[1:]
        prefix = json.loads(srv.state_path.read_text())["shm_prefix"]
        os.kill(first.pid, signal.SIGKILL)  # a crash: no graceful unload, stub and shm left over
        assert wait_for(lambda: not LocalTriton(cfg).status().running)
        assert "stale pid file" in LocalTriton(cfg).status().detail

        second = srv.start()
        assert second.running and second.live and second.pid != first.pid
        assert not alive(stubs)
        assert not shm_regions(prefix)
    finally:
        srv.stop()
    assert not processes_mentioning(cfg.state_dir)
