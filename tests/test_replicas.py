"""Three Triton replicas behind one name: the local form of a Kubernetes headless Service.

Three real ``tritonserver`` processes on 127.0.0.2/3/4 (same ports, one shared repository, as
pods behind a headless Service) are addressed as ``dns:///seqcls-triton.test:<port>``;
``SEQCLS_TRITON_RESOLVE`` answers that name with the three addresses (the cluster DNS would).
A release reloads, smoke-tests and exposes on each; one replica killed mid-reload fails the
release, which rolls back on the others; once it is back, one ``sync`` converges all three.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from seqcls.errors import SeqclsError
from seqcls.localtriton import LocalTriton, TritonServerConfig, free_ports
from seqcls.ops.status import status
from seqcls.ops.sync import sync
from seqcls.release.intake import open_release
from seqcls.serving.client import TritonOps, endpoints_from_settings
from seqcls.serving.state import current_state
from seqcls.settings import PROJECT_ROOT, Settings
from seqcls.steps import run_release

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.drill]

NAME = "seqcls-triton.test"
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
ARTIFACT = PROJECT_ROOT / "var" / "test-artifacts" / "replicas.json"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("replicas")


@pytest.fixture(scope="module")
def replicas(root: Path) -> Iterator[list[LocalTriton]]:
    http, grpc, metrics = free_ports(3)
    servers = [
        LocalTriton(
            TritonServerConfig(
                repository=root / "repo",
                host=addr,
                http_port=http,
                grpc_port=grpc,
                metrics_port=metrics,
                state_dir=root / f"state-{addr}",
            )
        )
        for addr in ADDRESSES
    ]
    try:
        for s in servers:
            s.start()
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def settings(replicas: list[LocalTriton], root: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    cfg = replicas[0].config
    for key, value in {
        "SEQCLS_HOME": str(root / "home"),
        "SEQCLS_TRITON_REPOSITORY": str(cfg.repository),
        "SEQCLS_TRITON_GRPC": f"dns:///{NAME}:{cfg.grpc_port}",
        "SEQCLS_TRITON_HTTP": f"dns:///{NAME}:{cfg.http_port}",
        "SEQCLS_TRITON_RESOLVE": f"{NAME}={','.join(ADDRESSES)}",
        "SEQCLS_MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
    }.items():
        monkeypatch.setenv(key, value)
    return Settings.from_env()


def _serving_seconds(results) -> float:
    return round(sum(r.seconds for r in results if r.step in ("reload", "smoke", "expose")), 2)


def _served_everywhere(settings: Settings, version: int) -> None:
    for ep in endpoints_from_settings(settings):
        assert TritonOps(ep).ready("seqcls", version), f"{ep.grpc} does not serve version {version}"


def test_name_resolves_to_one_endpoint_per_replica(settings: Settings, replicas: list[LocalTriton]) -> None:
    grpc = [e.grpc for e in endpoints_from_settings(settings)]
    assert grpc == [f"{a}:{replicas[0].config.grpc_port}" for a in ADDRESSES]
    assert all(
        e.http and e.http.endswith(f":{replicas[0].config.http_port}") for e in endpoints_from_settings(settings)
    )


def test_release_reaches_every_replica_and_a_replica_killed_mid_reload_converges(
    settings: Settings, replicas: list[LocalTriton], tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path
) -> None:
    first = run_release(open_release(tiny_checkpoint_src, settings=settings))
    assert {r.step: r.summary for r in first}["smoke"]["endpoints"] == [
        e.grpc for e in endpoints_from_settings(settings)
    ]
    _served_everywhere(settings, 1)
    reports = status(settings)
    assert len(reports) == 1 and len(reports[0].endpoints) == 3 and reports[0].agree, reports[0].lines()

    # B is published; the moment its reload is recorded, the second replica is killed -9
    repo = Path(str(settings.triton_repository))
    run_release(open_release(tiny_checkpoint_b_src, settings=settings), until="publish")
    victim = replicas[1]
    pid = victim.status().pid
    assert pid

    t0 = time.perf_counter()
    killed = False
    stop = threading.Event()

    def watch() -> None:
        nonlocal killed
        while not stop.is_set() and not killed:
            with contextlib.suppress(Exception):  # the state file being replaced: look again
                if current_state(repo, ModelName("seqcls")).candidate == 2:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with pytest.raises(SeqclsError):
        run_release(open_release(tiny_checkpoint_b_src, settings=settings))
    stop.set()
    watcher.join(timeout=30)
    assert killed, "the replica was never killed: the drill proved nothing"
    state = current_state(repo, ModelName("seqcls"))
    assert state.serving == 1 and state.candidate in (None, 2)
    live = [s for s in replicas if s is not victim]
    for s in live:  # the survivors still serve A
        assert TritonOps(endpoints_from_settings(settings)[replicas.index(s)]).ready("seqcls", 1)
    assert not status(settings)[0].agree  # the dead replica is reported, with the fix

    victim.stop()  # clear the stale pid/shm state of the killed process
    victim.start()
    results = sync(settings)
    recovered = time.perf_counter() - t0
    assert all(r.ok for r in results), [r.to_dict() for r in results]
    _served_everywhere(settings, 1)
    report = status(settings)[0]
    assert report.agree and len(report.endpoints) == 3, report.lines()
    assert current_state(repo, ModelName("seqcls")).candidate is None
    again = sync(settings)
    assert again[0].actions == [], again[0].actions

    # the same release on all three, now that every replica is up
    third = run_release(open_release(tiny_checkpoint_b_src, settings=settings))
    _served_everywhere(settings, 2)
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(
        json.dumps(
            {
                "replicas": len(ADDRESSES),
                "first_release_serving_steps_s": _serving_seconds(first),
                "release_after_recovery_serving_steps_s": _serving_seconds(third),
                "kill_to_converged_s": round(recovered, 2),
            },
            indent=1,
        )
    )
