"""The main job (`make demo` → `seqcls demo`) end to end: train, release through the Airflow DAG,
report; a worse retrain refused by the quality gate with serving unchanged; the second run says the
checkpoint is already released (and refuses the retrain again); nothing is left running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from seqcls.localtriton import free_ports

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "demo", "--quick"], env=env, capture_output=True, text=True, timeout=900
    )


def test_demo_main_job_twice(tmp_path: Path) -> None:
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
    assert "already released" not in out
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
