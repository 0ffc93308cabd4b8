"""Nothing goes live without its verdicts — through Airflow's params, as a team's DAG run would try it.

A models file configures model ``alpha`` with an eval set; the trained demo model becomes champion
on it through a real ``dag.test()`` run (real local Triton and MLflow). Then three runs of its worse
retrain (four labels never predicted), each by a param the trigger form offers:

- a loosened rule (``max_f1_drop: "1"``, as the form sends numbers) is refused before any work;
- an emptied ``eval_set`` (dropping the models file's) is refused at the quality gate, because the
  champion was judged on an eval set;
- the same with ``override``/``override_reason`` goes live, and the override is in history, on the
  MLflow model version and in ``status``.

The refused runs leave Triton, the served state and the MLflow champion exactly as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.airflow import (
    DAGS,
    TASKS,
    airflow_db,
    private_airflow_home,
    ready_models,
    run_dag,
    task_logs_reach_this_test,
    tasks_between,
    triton,
)
from tests.helpers.demo_models import demo_eval_file, quick_demo_model, worse_retrain

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow
__all__ = ["airflow_db", "task_logs_reach_this_test", "triton"]

MODEL = "alpha"
DAG_ID = f"seqcls_release__{MODEL}"
REPORT_TASK = "report_outcome"
REASON = "accepted: the four switched-off labels are retired this quarter (ticket OPS-42)"


def _parse(models: Path, monkeypatch: pytest.MonkeyPatch):
    """The models file's DAG for alpha, parsed afresh (an in-process dag.test() leaves conf in dag.params)."""
    from airflow.dag_processing.dagbag import DagBag

    for var in ("SEQCLS_SCHEDULE", "SEQCLS_MODEL_NAME", "SEQCLS_PADDLE_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SEQCLS_MODELS_FILE", str(models))
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags[DAG_ID]


def _cli(server, *args: str) -> subprocess.CompletedProcess:
    """``seqcls ARGS --model-name alpha`` against the DAG's Triton (its Connection, as the CLI's settings)."""
    cfg = server.config
    endpoints = {
        "SEQCLS_TRITON_REPOSITORY": str(cfg.repository),
        "SEQCLS_TRITON_GRPC": cfg.grpc_url,
        "SEQCLS_TRITON_HTTP": cfg.http_url,
    }
    return subprocess.run(
        [sys.executable, "-m", "seqcls.cli", *args, "--model-name", MODEL],
        env={**os.environ, **endpoints},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _served(settings) -> tuple[int | None, int | None]:
    """(Triton version alpha serves, MLflow champion version) — what a refused run must leave unchanged."""
    from seqcls.contract.names import ModelName
    from seqcls.registry.ledger import CHAMPION, alias_version
    from seqcls.serving.repository import Repository

    model = ModelName(MODEL)
    return Repository.from_settings(settings, model).serving_version(), alias_version(settings, model, CHAMPION)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_a_dag_run_cannot_loosen_a_rule_or_drop_the_eval_set_without_a_recorded_override(
    airflow_db: Path,
    triton,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from seqcls.contract.names import ModelName
    from seqcls.settings import Settings

    root = tmp_path / "checkpoints"
    models_root = root / MODEL
    shutil.copytree(quick_demo_model(tmp_path_factory).path, models_root / "good")
    worse_retrain(models_root / "good", models_root / "worse")
    demo_eval_file((models_root / "eval").mkdir(parents=True) or models_root / "eval" / "test.txt")
    models = tmp_path / "seqcls-models.yaml"
    models.write_text(
        textwrap.dedent(f"""
        models:
          - name: {MODEL}
            eval_set: eval/test.txt
        """).lstrip(),
        encoding="utf-8",
    )
    monkeypatch.setenv("SEQCLS_CHECKPOINTS_ROOT", str(root))
    settings = Settings.from_env(triton_repository=triton.config.repository)
    names = ModelName(MODEL).names

    # 1. the champion, judged on the models file's eval set
    dr, states = run_dag(_parse(models, monkeypatch), {"checkpoint": "good"})
    assert dr.state == "success", states
    assert "evaluate:" in "".join(capfd.readouterr())
    assert _served(settings) == (1, 1)
    assert ready_models(triton) == {m: ["1"] for m in names.models}

    # 2. a loosened rule from the form (text, as the form sends it): refused before any work
    dr, states = run_dag(_parse(models, monkeypatch), {"checkpoint": "worse", "max_f1_drop": "1"})
    assert dr.state == "failed", states
    assert states["resolve_checkpoint"] == "failed", states
    assert all(states[t] == "upstream_failed" for t in tasks_between("resolve_checkpoint", "rollback")), states
    text = "".join(capfd.readouterr())
    assert "max_f1_drop" in text and "loosens the quality gate" in text and "--override quality" in text, text[-3000:]
    assert _served(settings) == (1, 1)

    # 3. the eval set the models file configured, emptied in the form: refused at the quality gate
    dr, states = run_dag(_parse(models, monkeypatch), {"checkpoint": "worse", "eval_set": ""})
    assert dr.state == "failed", states
    assert all(states[t] == "success" for t in tasks_between(None, "evaluate_quality")), states
    assert states["evaluate_quality"] == "failed", states
    assert states["expose_version"] == states["promote"] == "upstream_failed", states
    text = "".join(capfd.readouterr())
    assert "was judged on an eval set" in text, text[-3000:]
    assert _served(settings) == (1, 1)
    assert ready_models(triton) == {m: ["1"] for m in names.models}
    status = _cli(triton, "status")
    assert status.returncode == 0, status.stdout + status.stderr

    # 4. the same run with an override and its reason: live, and loud where an auditor looks
    conf = {"checkpoint": "worse", "eval_set": "", "override": "quality", "override_reason": REASON}
    dr, states = run_dag(_parse(models, monkeypatch), conf)
    assert dr.state == "success", states
    assert states == {**{t: "success" for t in TASKS}, "rollback": "skipped", REPORT_TASK: "success"}, states
    assert _served(settings) == (2, 2)
    history = _cli(triton, "history", "--json")
    assert history.returncode == 0, history.stderr
    overrides = [e for e in json.loads(history.stdout)["entries"] if e["kind"] == "override"]
    assert [(e["gate"], e["reason"]) for e in overrides] == [("quality", REASON)], history.stdout[-2000:]
    from mlflow.tracking import MlflowClient

    uri = settings.mlflow_tracking_uri
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    version = client.get_model_version(MODEL, "2")
    assert version.tags["seqcls.quality"] == "overridden" and version.tags["seqcls.override.quality"] == REASON
    status = _cli(triton, "status")
    assert "went live under an override of quality" in status.stdout, status.stdout
