"""Preflight at resolve (issue 25): a bad param, an unreachable Triton or MLflow fails in seconds, naming
what to fix, before export — no traceback in the CLI, nothing exported, nothing registered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.config import ReleaseConfig
from seqcls.errors import InputError
from seqcls.localtriton import free_ports
from seqcls.release.intake import open_release
from seqcls.steps.preflight import preflight

CLI = [sys.executable, "-m", "seqcls.cli"]


def _manifest_steps(home: Path) -> dict:
    steps: dict = {}
    for manifest in (home / "releases").glob("*/*/manifest.json"):
        steps.update(json.loads(manifest.read_text()).get("steps", {}))
    return steps


def test_a_threshold_for_an_unknown_label_is_refused_at_resolve_with_a_suggestion(tiny_checkpoint: Path) -> None:
    labels = (tiny_checkpoint / "label.txt").read_text(encoding="utf-8").split()
    typo = labels[0][:-1] + "x"
    release = open_release(tiny_checkpoint, ReleaseConfig(thresholds={typo: 0.7}))
    with pytest.raises(InputError) as err:
        preflight(release, servers=())
    message = str(err.value)
    assert message.startswith("thresholds"), message
    assert repr(typo) in message and f"did you mean {labels[0]!r}" in message


def test_preflight_passes_the_params_and_reports_each_check(tiny_checkpoint: Path) -> None:
    release = open_release(tiny_checkpoint, ReleaseConfig(threshold=0.4))
    report = preflight(release, servers=())
    assert [c.name for c in report.checks] == ["params", "eval set"]
    assert all(c.ok for c in report.checks)
    assert "mlflow and triton not checked" in report.line()


def _cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SEQCLS_HOME": str(home), **env},
    )


@pytest.mark.slow
def test_cli_release_refuses_bad_params_and_dead_servers_before_export(tiny_checkpoint: Path, home: Path) -> None:
    labels = (tiny_checkpoint / "label.txt").read_text(encoding="utf-8").split()
    bad = _cli(home, "release", "--checkpoint", str(tiny_checkpoint), "--thresholds", json.dumps({"nope": 0.6}))
    assert bad.returncode == 2, bad.stderr
    assert "Traceback" not in bad.stderr
    assert "error: thresholds" in bad.stderr and "'nope'" in bad.stderr and labels[0] in bad.stderr
    assert "export" not in _manifest_steps(home)

    grpc, mlflow = free_ports(2)  # nothing listens on either
    down = _cli(
        home,
        "release",
        "--checkpoint",
        str(tiny_checkpoint),
        "--grpc",
        f"127.0.0.1:{grpc}",
        SEQCLS_MLFLOW_TRACKING_URI=f"http://127.0.0.1:{mlflow}",
    )
    assert down.returncode == 1, down.stderr
    assert "Traceback" not in down.stderr
    first = down.stderr.split("error: ", 1)[1]
    assert f"127.0.0.1:{grpc}" in first and "seqcls triton start" in first  # the endpoint and how to start one
    assert f"http://127.0.0.1:{mlflow}" in first and "SEQCLS_MLFLOW_TRACKING_URI" in first
    assert "export" not in _manifest_steps(home), "preflight must fail before any heavy step"
    assert not list(home.glob("mlruns*")) and not (home / "mlflow.db").exists()
