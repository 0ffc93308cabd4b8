"""The drill harness: a real local Triton and MLflow, one drill at a time, ending in the invariant.

After a scenario and at most one ``seqcls sync``: every endpoint serves the recorded version,
MLflow's champion equals it, nothing is left unready, no temporary file or directory is left
behind (``seqcls status`` agreeing is the check — the same command an operator runs). The
fixtures (``drill``, ``drill_triton``, ``drill_root``) are in ``tests/conftest.py``: one Triton per
test module, reset between drills, one release home per test run so the tiny checkpoints are
exported and validated once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from seqcls.config import ReleaseConfig
from seqcls.contract.names import ModelName
from seqcls.localtriton import LocalTriton
from seqcls.ops.status import status
from seqcls.ops.sync import incomplete_versions, stale_temporaries, sync
from seqcls.release.intake import open_release
from seqcls.serving.repository import Repository
from seqcls.serving.state import current_state
from seqcls.settings import CONTROL_KEY_FILE as KEY_FILE
from seqcls.settings import PROJECT_ROOT, Settings
from seqcls.steps import run_release

#: scenario → outcome → seconds to recover; each drill module writes var/test-artifacts/drills-<module>.json
RECORD: list[dict] = []


def write_record(module: str) -> None:
    out = PROJECT_ROOT / "var" / "test-artifacts" / f"drills-{module}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for r in RECORD if r.get("module") == module]
    out.write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")


def timed_sync(settings: Settings, scenario: str, outcome: str, *, module: str = "test_drills") -> list:
    t0 = time.perf_counter()
    results = sync(settings)
    RECORD.append(
        {
            "module": module,
            "scenario": scenario,
            "outcome": outcome,
            "recover_seconds": round(time.perf_counter() - t0, 2),
        }
    )
    return results


def unload_all(server: LocalTriton) -> None:
    """What a restarted replica holds in explicit mode before anything loads: nothing (files untouched)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=server.config.grpc_url)
    headers = server.control_headers()
    for m in client.get_model_repository_index(headers=headers).models:
        if m.state == "READY":
            client.unload_model(m.name, headers=headers)
    deadline = time.monotonic() + 30
    while any(m.state == "READY" for m in client.get_model_repository_index(headers=headers).models):
        assert time.monotonic() < deadline, "models still loaded 30 s after unload"
        time.sleep(0.2)


def reset(server: LocalTriton) -> None:
    """Every model unloaded, the repository emptied (but the server's control key file)."""
    unload_all(server)
    for p in server.config.repository.iterdir():
        if p.name != KEY_FILE:
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def repo_of(settings: Settings, model_name: str = ModelName("seqcls")) -> Repository:
    return Repository.from_settings(settings, model_name)


@dataclass
class Drill:
    settings: Settings
    server: LocalTriton
    env: dict[str, str]

    @property
    def repo(self) -> Path:
        return Path(str(self.settings.triton_repository))

    def release(self, ckpt: Path, settings: Settings | None = None, **config) -> list:
        return run_release(open_release(ckpt, ReleaseConfig(**config), settings or self.settings))

    def cli(self, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "seqcls.cli", *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def state(self, model_name: str = ModelName("seqcls")):
        return current_state(self.repo, model_name)

    def assert_invariant(self, *, served: int | None = None) -> None:
        """The drill's end condition (see the module docstring)."""
        reports = status(self.settings)
        assert reports, "no recorded state at all"
        for r in reports:
            assert r.agree, "\n".join(r.lines())
        if served is not None:
            assert self.state().serving == served
        leftovers = stale_temporaries(repo_of(self.settings)) + incomplete_versions(repo_of(self.settings), set())
        leftovers += list(self.repo.glob(".tmp-*")) + list(self.repo.glob("*.tmp"))
        assert not leftovers, f"temporary files left behind: {leftovers}"


def make_drill(server: LocalTriton, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Drill:
    """A fresh drill on ``server``: its repository emptied, its own MLflow database, a shared home."""
    reset(server)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {
        "SEQCLS_HOME": str(home),
        "SEQCLS_TRITON_REPOSITORY": str(server.config.repository),
        "SEQCLS_TRITON_GRPC": server.config.grpc_url,
        "SEQCLS_TRITON_HTTP": server.config.http_url,
        "SEQCLS_MLFLOW_TRACKING_URI": uri,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    env.pop("SEQCLS_FAULT_PLAN", None)
    return Drill(Settings.from_env(), server, env)


def when(condition, action, *, timeout: float = 300.0) -> threading.Thread:
    """Run ``action`` the moment ``condition()`` holds (polled every 20 ms), from a watcher thread."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    action()
                    return
            except Exception:  # a state file being replaced: look again
                pass
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


#: What marks a test as a drill (real Triton + MLflow; `-m "not drill"` leaves them out).
DRILL = (pytest.mark.slow, pytest.mark.integration, pytest.mark.drill)
#: Texts whose served answers a drill compares before and after what it does.
PROBE_TEXTS = ["the same text before and after", "一段固定的测试文本", "x"]


def drill_test(test):
    """Mark ``test`` as a drill (the unit tests beside it run in the fast tier)."""
    for mark in DRILL:
        test = mark(test)
    return test


def served_answers(d: Drill, model_name: str) -> list:
    """What ``model_name``'s public route answers to :data:`PROBE_TEXTS` now (probabilities rounded to 1e-5)."""
    from seqcls.serving.client import TritonOps, endpoints_from_settings

    preds, probs = TritonOps(endpoints_from_settings(d.settings)[0]).infer(
        PROBE_TEXTS, model=ModelName(model_name).names.ensemble
    )
    return [preds, [[round(float(p), 5) for p in row] for row in probs]]


def champion(settings: Settings, model_name: str = ModelName("seqcls")) -> int | None:
    from seqcls.registry.ledger import CHAMPION, alias_version

    return alias_version(settings, model_name, CHAMPION)
