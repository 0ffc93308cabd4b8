"""Ports handed out to concurrent pytest-xdist workers, and a port someone else answers on.

- **One slice per worker.** ``free_ports`` picks at random and releases what it picked; the server binds
  seconds later. Two workers picking from one range could hand one port to two servers (a fresh-clone CI
  run: another worker's Triton answered gRPC on the Airflow api-server's port, seen as
  ``BadStatusLine('\\x00\\x00\\x18\\x04…')``). ``SEQCLS_PORT_RANGE`` confines the picks; the test suite's
  conftest gives each worker its own slice, inherited by every process the worker starts.
- **A stranger on the stack's port.** The Airflow stack fails at once naming the port and who holds it,
  before its slow start-up and when a foreign listener shows up on the api-server's port during it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import psutil
import pytest

from seqcls.errors import InputError, SeqclsError
from seqcls.localtriton import free_ports
from seqcls.localtriton.ports import PORT_RANGE_VAR, default_port_range, ephemeral_range, port_range, port_slice
from seqcls.settings import Settings

ROOT = Path(__file__).resolve().parents[1]

#: A pytest session as one xdist worker would start it (the real tests/conftest.py), collecting only; at its
#: end it hands out ports the way the fixtures do, with the random generator seeded alike in every worker.
_WORKER = """
import json, os, random, sys
import pytest

class HandOut:
    def pytest_sessionfinish(self):
        from seqcls.localtriton import free_ports
        random.seed(0)  # every worker draws the same numbers: only their ranges can keep them apart
        ports = [p for _ in range(40) for p in free_ports(3)]
        with open(sys.argv[1], "w") as f:
            json.dump({"range": os.environ.get("SEQCLS_PORT_RANGE"), "ports": ports}, f)

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--co", sys.argv[2]], plugins=[HandOut()]))
"""


def _worker_ports(worker: str, count: int, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != PORT_RANGE_VAR and not k.startswith("PYTEST_XDIST_")}
    env.update(PYTEST_XDIST_WORKER=worker, PYTEST_XDIST_WORKER_COUNT=str(count))
    proc = subprocess.run(
        [sys.executable, "-c", _WORKER, str(out), str(ROOT / "tests" / "test_ports.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_two_xdist_workers_never_hand_out_the_same_port(tmp_path: Path) -> None:
    """Deterministic: both workers seed the generator alike, so picks from one shared range repeat exactly."""
    gw0 = _worker_ports("gw0", 2, tmp_path / "gw0.json")
    gw1 = _worker_ports("gw1", 2, tmp_path / "gw1.json")
    shared = sorted(set(gw0["ports"]) & set(gw1["ports"]))
    assert not shared, f"both workers handed out {len(shared)} ports: {shared[:10]}"
    low, high = default_port_range()
    slices = []
    for got in (gw0, gw1):
        lo, hi = port_range({PORT_RANGE_VAR: got["range"]})  # set by the conftest, inherited by child processes
        assert low <= lo <= hi <= high, (got["range"], low, high)
        assert all(lo <= p <= hi for p in got["ports"]), got
        slices.append((lo, hi))
    assert slices[0][1] < slices[1][0], slices


def test_the_slices_cover_the_range_without_overlap() -> None:
    for count in (1, 2, 3, 7):
        slices = [port_slice(i, count, 1024, 32767) for i in range(count)]
        assert slices[0][0] == 1024 and slices[-1][1] == 32767
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(slices)), slices
    with pytest.raises(ValueError, match=r"no slice 2 of 2 \(0 to 1\)"):
        port_slice(2, 2, 1024, 32767)


def test_the_default_range_is_below_the_ephemeral_range() -> None:
    low, high = default_port_range()
    eph_low, _ = ephemeral_range()
    assert low == 1024
    if eph_low - 1024 >= 2000:
        assert high == eph_low - 1


def test_free_ports_keep_to_the_configured_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_VAR, "23000-23009")
    for _ in range(5):
        ports = free_ports(4)
        assert len(set(ports)) == 4 and all(23000 <= p <= 23009 for p in ports), ports


class _FreeSocket:
    """A socket bound to ``port``, as :func:`ports._bindable` returns it: the range is all free, whatever
    the other worker's servers hold right now (a real range here once lost a port to one of them)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        pass


def test_free_ports_do_not_hand_a_port_out_twice_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process asking twice (the team stack's three free_port() calls per Triton, each released before
    the next) gets different ports while the range has others."""
    from seqcls.localtriton import ports

    monkeypatch.setenv(PORT_RANGE_VAR, "23100-23119")
    monkeypatch.setattr(ports, "_bindable", lambda family, host, port: _FreeSocket(port))
    monkeypatch.setattr(ports, "_handed", {})
    seen = [p for _ in range(5) for p in free_ports(4)]
    assert len(set(seen)) == 20, seen


def test_a_range_too_full_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_VAR, "23200-23201")
    with socket.create_server(("127.0.0.1", 23200)):
        with pytest.raises(InputError, match=r"SEQCLS_PORT_RANGE=23200-23201.*1 free port.*2 were asked for"):
            free_ports(2)
        assert free_ports(1) == (23201,)


@pytest.mark.parametrize("value", ["abc", "2000", "3000-2000", "0-100", "1024-70000", "1024-2000-3000", " - "])
def test_a_bad_port_range_names_the_variable_and_value(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_VAR, value)
    with pytest.raises(InputError, match=rf"{PORT_RANGE_VAR}={re.escape(repr(value))}.*low-high"):
        free_ports(1)


def test_an_unset_or_empty_range_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_VAR, "")
    assert port_range() is None
    monkeypatch.delenv(PORT_RANGE_VAR)
    assert port_range() is None
    assert port_range({PORT_RANGE_VAR: " 2000-3000 "}) == (2000, 3000)


# ----------------------------------------------------------------------------- a stranger on the stack's port


def _grpc_server(port: int):
    """A real gRPC server on ``port`` (what another worker's Triton answers with: HTTP/2 frames)."""
    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    server.start()
    return server


def _stack(root: Path, port: int):
    from seqcls_tools.demo.stack import AirflowStack

    settings = Settings(
        home=root / "home",
        triton_repository=root / "repo",
        triton_grpc=("127.0.0.1:18001",),
        triton_http=("127.0.0.1:18000",),
        mlflow_tracking_uri=f"sqlite:///{root / 'home' / 'mlflow.db'}",
    )
    return AirflowStack(root / "stack", settings, port=port)


def _me() -> str:
    return f"pid {os.getpid()} ({psutil.Process().name()})"


@pytest.mark.drill
def test_a_grpc_server_on_the_api_servers_port_fails_the_start_at_once_naming_it(tmp_path: Path) -> None:
    """The CI failure: before, ``start()`` migrated the database and spawned every component, then its health
    poll read the gRPC server's SETTINGS frame and raised a bare ``BadStatusLine``; the api-server, unable
    to bind, was left to die. Now it fails before starting anything, naming the port and its holder."""
    (port,) = free_ports(1)
    stack = _stack(tmp_path, port)
    server = _grpc_server(port)
    t0 = time.monotonic()
    try:
        with pytest.raises(SeqclsError) as err:
            stack.start(timeout=60)
    finally:
        server.stop(None)
        stack.stop()
    took = time.monotonic() - t0
    message = str(err.value)
    assert f"port {port} (Airflow api-server) on 127.0.0.1 is already in use by {_me()}" in message, message
    assert "choose another" in message, message
    assert took < 10, took
    assert not stack.procs and not (stack.logs / "db-migrate.log").exists()


@pytest.mark.drill
def test_a_stranger_answering_on_the_port_during_start_up_is_named(tmp_path: Path) -> None:
    """The port taken after the check, while the components boot: the health poll finds a listener that
    is none of the stack's processes and stops at once instead of reading its answer as Airflow's."""
    (port,) = free_ports(1)
    stack = _stack(tmp_path, port)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    stack.procs["api-server"] = sleeper  # an api-server still booting
    server = _grpc_server(port)
    t0 = time.monotonic()
    try:
        with pytest.raises(SeqclsError) as err:
            stack.wait_ready(timeout=60)
    finally:
        server.stop(None)
        stack.stop()
    message = str(err.value)
    assert f"port {port} is held by {_me()}, not this stack's api-server" in message, message
    assert time.monotonic() - t0 < 10
    assert sleeper.poll() is not None  # the stack's processes were stopped


def test_the_stacks_own_listener_is_accepted(tmp_path: Path) -> None:
    """The check does not refuse the stack itself: a process the stack started answering health is ready."""
    (port,) = free_ports(1)
    stack = _stack(tmp_path, port)
    site = tmp_path / "site"
    (site / "api" / "v2" / "monitor").mkdir(parents=True)
    (site / "api" / "v2" / "monitor" / "health").write_text("{}")
    stack.procs["api-server"] = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(site), str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        stack.wait_ready(timeout=60)
    finally:
        stack.stop()
