"""The object-store release tests' shared parts: a cuttable relay in front of SeaweedFS, a fresh prefix per
test, a real Triton on the store, and a seqcls process run with the store's settings (for kill -9 drills)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from seqcls.localtriton import LocalTriton
from seqcls.serving.backend import StoreRepository
from seqcls.serving.objectstore import ObjectStore
from seqcls.serving.s3repo import S3Repository, served_versions, triton_repository
from seqcls.serving.s3state import S3ServingState
from seqcls.settings import PROJECT_ROOT, Settings
from tests.helpers.seaweedfs import SeaweedFS
from tests.helpers.triton import start_triton

MODEL = ModelName("seqcls")


class Proxy:
    """A TCP relay in front of the store that a test can cut (the store unreachable) and restore."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.up = target, threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.up.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while self.up.is_set() and (data := src.recv(65536)):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self.up.clear()
        self.server.close()


@pytest.fixture
def store_env(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Proxy]]:
    """A fresh prefix on the store, reached through a :class:`Proxy`; the AWS variables point at it."""
    host, port = seaweedfs.endpoint.split("://")[1].split(":")
    proxy = Proxy((host, int(port)))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweedfs.credentials.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweedfs.credentials.secret_access_key)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    yield f"s3://{seaweedfs.bucket}/release-{uuid.uuid4().hex[:8]}", proxy
    proxy.close()


def triton_on_store(seaweedfs: SeaweedFS, uri: str, root: Path, key: str) -> LocalTriton:
    """A real Triton on the store itself (not through the proxy: a cut store must not be a dead Triton)."""
    location = seaweedfs.location(uri.split("/", 3)[3])
    # tritonserver 2.51 refuses to start on a prefix with no object ("not a valid directory")
    ObjectStore(location).put_immutable("README.txt", b"a seqcls model repository\n")
    triton = triton_repository(location)
    return start_triton(root, repository=triton.uri, control_key=key, environment=triton.environment)


def store_settings(server: LocalTriton, home: Path, uri: str, key: str) -> Settings:
    cfg = server.config
    return Settings(
        home=home,
        triton_repository=uri,
        triton_grpc=(cfg.grpc_url,),
        triton_http=(cfg.http_url,),
        triton_control_key=key,
    )


def store_of(settings: Settings) -> StoreRepository:
    store = StoreRepository.at(Path(str(settings.triton_repository)))
    assert store is not None
    return store


def served(settings: Settings) -> tuple[int | None, tuple[int, ...]]:
    """(recorded serving version on the store, versions the store's ensemble config serves)."""
    store = store_of(settings).store
    state = S3ServingState(store, MODEL).read().state
    config = S3Repository(store).read_config(MODEL.names.ensemble)
    return state.serving, served_versions(config[0], MODEL.names.ensemble) if config else ()


def run_seqcls(script: str, argv: list[str], settings: Settings, home: Path, **env: str) -> subprocess.CompletedProcess:
    """``script`` in its own interpreter with the store's settings (``env``: more variables, e.g. a fault plan)."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [*(str(PROJECT_ROOT / p) for p in ("plugins", "tools", ".")), os.environ.get("PYTHONPATH", "")]
        ),
        "SEQCLS_HOME": str(home),
        "SEQCLS_TRITON_REPOSITORY": str(settings.triton_store),
        "SEQCLS_TRITON_GRPC": settings.triton_grpc[0],
        "SEQCLS_TRITON_HTTP": settings.triton_http[0],
        "SEQCLS_TRITON_CONTROL_KEY": str(settings.triton_control_key),
        **env,
    }
    argv = [sys.executable, "-c", script, *argv]
    return subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=900)


def killed_release(ckpt: Path, settings: Settings, home: Path) -> subprocess.CompletedProcess:
    """A release of ``ckpt`` in its own process, killed (SIGKILL) just before a version's first store marker."""
    script = (
        "import sys\nfrom seqcls.release.intake import open_release\nfrom seqcls.steps import run_release\n"
        "run_release(open_release(sys.argv[1]))\n"
    )
    return run_seqcls(script, [str(ckpt)], settings, home, SEQCLS_FAULT_PLAN="die@publish:before-store-marker")


__all__ = [
    "MODEL",
    "Proxy",
    "killed_release",
    "run_seqcls",
    "served",
    "store_env",
    "store_of",
    "store_settings",
    "triton_on_store",
]
