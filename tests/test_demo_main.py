"""The main job (`make demo` → `seqcls demo`) end to end: release through the Airflow DAG, report; a
retrain trained by the demo itself and refused by the quality gate with serving unchanged; the second
run says the checkpoint is already released (and refuses the retrain again); nothing is left running.

The first model is the session's quick demo model (tests/helpers/demo_models.py: the very training
`seqcls demo --quick` runs, done once per test run), placed where the demo keeps it; the demo trains the
retrain itself, so its training path runs here too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from seqcls.localtriton import free_ports
from tests.helpers.demo_models import quick_demo_model

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "demo", "--quick"], env=env, capture_output=True, text=True, timeout=900
    )


def test_demo_main_job_twice(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    shutil.copytree(quick_demo_model(tmp_path_factory).path, tmp_path / "demo" / "home" / "checkpoints" / "demo-v1")
    http, grpc = free_ports(2)
    env = {
        **os.environ,
        "SEQCLS_DEMO_DIR": str(tmp_path / "demo"),
        "SEQCLS_HOME": str(tmp_path / "demo" / "home"),
        "SEQCLS_TRITON_GRPC": f"127.0.0.1:{grpc}",
        "SEQCLS_TRITON_HTTP": f"127.0.0.1:{http}",
    }
    first = _run(env)
    assert first.returncode == 0, first.stderr[-3000:]
    out = first.stdout
    assert "seqcls serves Triton v1; MLflow champion: MLflow v1." in out
    assert "golden texts answered as validated" in out and "Predictions over gRPC:" in out
    assert out.count("→") == 5 and "mlflow ui --backend-store-uri" in out
    logs = first.stdout + first.stderr
    assert "already released" not in out and "reusing the trained checkpoint" in logs
    assert "training the demo classifier into" in logs and "demo-v2-retrain" in logs
    assert "refused by the quality gate" in out and "max_f1_drop on micro_f1" in out, out[-3000:]
    assert "seqcls still serves Triton v1; MLflow champion still MLflow v1." in out

    second = _run(env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (
        "was already released" in second.stdout
        and "seqcls serves Triton v1; MLflow champion: MLflow v1." in second.stdout
    )
    assert "seqcls still serves Triton v1; MLflow champion still MLflow v1." in second.stdout
    leftovers = [
        p for p in psutil.process_iter(["cmdline"]) if any(str(tmp_path) in part for part in (p.info["cmdline"] or []))
    ]
    assert not leftovers, [p.info["cmdline"][:3] for p in leftovers]
