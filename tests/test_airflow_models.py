"""Several models, one DAG each, from one models file; the champion Asset; alpha and beta in parallel.

- the models file (``seqcls.airflow.models``): schema, strict validation, errors naming the file,
  the model and the key; the DAGs parsed from it (ids, schedules, Params defaults, outlets);
- the champion Asset: a consumer DAG scheduled on ``seqcls://models/<model>/champion`` is queued
  by a producer run's event and the scheduler's own asset-triggered run creation makes its run,
  consuming that event (no long-running scheduler: one pass of the code the scheduler loop runs);
- alpha and beta released through Airflow (``dag.test()`` of their DAGs, two processes at once)
  onto one Triton, each served and promoted under its own names.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from tests import test_airflow_dag as base

ROOT = base.ROOT
DAGS = base.DAGS
AIRFLOW_HOME = base.AIRFLOW_HOME  # private, set before anything imports airflow

# The Airflow fixtures of the DAG tests, shared (the session's migrated sqlite, Triton as a Connection).
airflow_db = base.airflow_db
triton = base.triton
_task_logs_reach_this_test = base._task_logs_reach_this_test

EXAMPLE = DAGS / "seqcls-models.example.yaml"


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def _bag(monkeypatch: pytest.MonkeyPatch, models_file: Path | str | None, folder: Path = DAGS, **env: str):
    from airflow.dag_processing.dagbag import DagBag

    for var in ("SEQCLS_SCHEDULE", "SEQCLS_MODEL_NAME", "SEQCLS_PADDLE_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    if models_file is None:
        monkeypatch.delenv("SEQCLS_MODELS_FILE", raising=False)
    else:
        monkeypatch.setenv("SEQCLS_MODELS_FILE", str(models_file))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return DagBag(dag_folder=str(folder))


# ----------------------------------------------------------------------------- the models file


def test_models_file_schema_and_dag_ids(tmp_path: Path) -> None:
    from seqcls.airflow.models import dag_id_for, load_models

    path = _write(
        tmp_path / "models.yaml",
        """
        defaults:
          schedule: asset
          triton_conn_id: triton_shared
          params: {profile: fp32-fused, threshold: 0.4}
        models:
          - name: seqcls
            schedule: manual
          - name: alpha
            params: {threshold: 0.6, thresholds: {"体育##夺冠": 0.7}}
          - name: beta
            schedule: "0 3 * * *"
            checkpoints_root: /data/beta
            mlflow_conn_id: mlflow_beta
        """,
    )
    default, alpha, beta = load_models(path)
    assert [m.dag_id for m in (default, alpha, beta)] == [
        "seqcls_release",
        "seqcls_release__alpha",
        "seqcls_release__beta",
    ]
    assert dag_id_for("alpha") == "seqcls_release__alpha"
    assert (default.schedule, alpha.schedule, beta.schedule) == (None, "asset", "0 3 * * *")
    # checkpoints: the default model keeps SEQCLS_CHECKPOINTS_ROOT, the others a directory of their own under it
    assert (default.checkpoints_root, alpha.checkpoints_root, beta.checkpoints_root) == ("", "alpha", "/data/beta")
    assert alpha.params == {
        "profile": "fp32-fused",
        "threshold": 0.6,
        "thresholds": {"体育##夺冠": 0.7},
        "triton_conn_id": "triton_shared",
        "mlflow_conn_id": "mlflow_default",
    }
    assert beta.params["mlflow_conn_id"] == "mlflow_beta" and beta.params["threshold"] == 0.4
    # the same file as JSON and TOML
    data = {"models": [{"name": "alpha", "params": {"atol": 0.001}}]}
    (tmp_path / "m.json").write_text(json.dumps(data))
    _write(tmp_path / "m.toml", '[[models]]\nname = "alpha"\nparams = {atol = 0.001}\n')
    (from_json,), (from_toml,) = load_models(tmp_path / "m.json"), load_models(tmp_path / "m.toml")
    assert from_json.params == from_toml.params and from_json.params["atol"] == 0.001
    # the shipped example is valid
    assert [m.name for m in load_models(EXAMPLE)] == ["seqcls", "alpha", "beta"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models: []\n", r"`models` must be a non-empty list"),
        ("model: [{name: a}]\n", r"unknown key\(s\) model \(allowed: defaults, models\)"),
        ("models: [{name: alpha, schedul: asset}]\n", r"model 'alpha': unknown key\(s\) schedul"),
        ("models: [{name: alpha}, {name: alpha}]\n", r"model 'alpha' is listed twice"),
        ("models:\n  - name: alpha\n    name: beta\n", r"duplicate key\(s\) name \(line 2\)"),
        (
            "models: [{name: alpha, params: {atol: 2}}]\n",
            r"model 'alpha': params\.atol: atol must be a number in \[0, 1\]",
        ),
        ("models: [{name: alpha, params: {opset: 99}}]\n", r"model 'alpha': params\.opset: opset must be an integer"),
        ("models: [{name: alpha, params: {thresholds: {x: 1.5}}}]\n", r"model 'alpha': params\.thresholds"),
        (
            "models: [{name: alpha, params: {profile: fp16}}]\n",
            r"model 'alpha': params\.profile: profile must be one of",
        ),
        ("models: [{name: alpha, params: {runtime: tf}}]\n", r"model 'alpha': params\.runtime"),
        ("models: [{name: alpha, params: {nope: 1}}]\n", r"model 'alpha': params: unknown key\(s\) nope"),
        (
            "models: [{name: alpha, params: {model_name: beta}}]\n",
            r"params\.model_name: the model's name is its `name`",
        ),
        ("models: [{name: alpha_model}]\n", r"model 'alpha_model': name: .*would collide"),
        ("models: [{name: ../x}]\n", r"model '\.\./x': name: model name '\.\./x' is not allowed"),
        ("models: [{name: alpha, schedule: 5}]\n", r"model 'alpha': schedule: expected manual, asset or a cron"),
        ("models: [{name: alpha, schedule: '@continuous'}]\n", r"model 'alpha': schedule: @continuous is not"),
        ("models: [{name: alpha, checkpoints_root: ../up}]\n", r"model 'alpha': checkpoints_root: .*'\.\.' is not"),
        ("models: [{name: alpha, triton_conn_id: ''}]\n", r"model 'alpha': triton_conn_id: must be a Connection id"),
        ("defaults: {checkpoints_root: /x}\nmodels: [{name: alpha}]\n", r"defaults: unknown key\(s\) checkpoints_root"),
        ("models: [{name: alpha}\n", r"not valid YAML"),
    ],
)
def test_models_file_errors_name_the_file_model_and_key(tmp_path: Path, text: str, expected: str) -> None:
    from seqcls.airflow.models import load_models
    from seqcls.errors import InputError

    path = tmp_path / "seqcls-models.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=expected) as info:
        load_models(path)
    assert str(info.value).startswith(str(path)), info.value


def test_models_file_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.airflow.models import models_file, release_models
    from seqcls.errors import InputError

    monkeypatch.delenv("SEQCLS_MODELS_FILE", raising=False)
    for var in ("SEQCLS_SCHEDULE", "SEQCLS_MODEL_NAME"):
        monkeypatch.delenv(var, raising=False)
    assert models_file(tmp_path) is None  # no file beside the DAG file: the single default DAG, as before
    (spec,) = release_models(tmp_path)
    assert (spec.name, spec.dag_id, spec.schedule, spec.checkpoints_root) == ("seqcls", "seqcls_release", None, "")
    monkeypatch.setenv("SEQCLS_MODEL_NAME", "alpha")
    monkeypatch.setenv("SEQCLS_SCHEDULE", "asset")
    (spec,) = release_models(tmp_path)  # the environment's model keeps the DAG id seqcls_release
    assert (spec.name, spec.dag_id, spec.schedule) == ("alpha", "seqcls_release", "asset")
    beside = _write(tmp_path / "seqcls-models.yaml", "models: [{name: beta}]\n")
    assert models_file(tmp_path) == beside
    with pytest.raises(InputError, match=r"SEQCLS_SCHEDULE/SEQCLS_MODEL_NAME are set too"):
        release_models(tmp_path)  # ambiguous: the environment's single DAG or the file's?
    monkeypatch.delenv("SEQCLS_MODEL_NAME")
    monkeypatch.delenv("SEQCLS_SCHEDULE")
    assert [m.dag_id for m in release_models(tmp_path)] == ["seqcls_release__beta"]
    monkeypatch.setenv("SEQCLS_MODELS_FILE", "none")
    assert models_file(tmp_path) is None
    monkeypatch.setenv("SEQCLS_MODELS_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(InputError, match=r"SEQCLS_MODELS_FILE=.*missing\.yaml.*no such file"):
        models_file(tmp_path)


def test_checkpoints_root_param_picks_where_latest_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.airflow import locate_checkpoint, settings_from_params
    from seqcls.errors import InputError

    monkeypatch.setenv("SEQCLS_CHECKPOINTS_ROOT", str(tmp_path / "root"))
    assert settings_from_params({}).checkpoints_root == tmp_path / "root"
    alpha = settings_from_params({"checkpoints_root": "alpha"})
    assert alpha.checkpoints_root == tmp_path / "root" / "alpha"
    assert locate_checkpoint("run-1", alpha) == tmp_path / "root" / "alpha" / "run-1"
    assert settings_from_params({"checkpoints_root": str(tmp_path / "b")}).checkpoints_root == tmp_path / "b"
    with pytest.raises(InputError, match=r"checkpoints_root '\.\./x': '\.\.' is not allowed"):
        settings_from_params({"checkpoints_root": "../x"})


def test_champion_extra_comes_from_the_promote_summary() -> None:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from seqcls.airflow.assets import champion_asset, champion_extra, checkpoints_asset, record_champion

    assert champion_asset("alpha").uri == champion_asset("alpha").name == "seqcls://models/alpha/champion"
    assert checkpoints_asset("alpha").uri == checkpoints_asset("alpha").name == "seqcls://checkpoints/alpha"
    summary = {"model_name": "alpha", "version": 3, "triton_version": 7, "fingerprint": "ab" * 32, "previous": 2}
    assert champion_extra(summary) == {"version": 3, "triton_version": 7, "fingerprint": "ab" * 32}
    events = OutletEventAccessors()
    record_champion(events, "alpha", summary)
    assert events[champion_asset("alpha")].extra == {"version": 3, "triton_version": 7, "fingerprint": "ab" * 32}
    with pytest.raises(ValueError, match="lacks fingerprint"):
        champion_extra({**summary, "fingerprint": ""})
    with pytest.raises(ValueError, match="promote released 'beta', not 'alpha'"):
        record_champion(events, "alpha", {**summary, "model_name": "beta"})


# ----------------------------------------------------------------------------- the DAGs parsed from it


def test_a_dag_per_model_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import TriggerRule

    from seqcls.airflow import TASK_ORDER

    bag = _bag(monkeypatch, EXAMPLE)
    assert bag.import_errors == {}, bag.import_errors
    assert sorted(bag.dags) == ["seqcls_release", "seqcls_release__alpha", "seqcls_release__beta", "seqcls_sync"]
    alpha, beta, default = (bag.dags[f"seqcls_release{s}"] for s in ("__alpha", "__beta", ""))
    for dag, model in ((alpha, "alpha"), (beta, "beta"), (default, "seqcls")):
        assert set(dag.task_ids) == set(TASK_ORDER) and dag.max_active_runs == 1 and dag.catchup is False
        assert dag.get_task("rollback").trigger_rule == TriggerRule.ONE_FAILED
        assert [a.uri for a in dag.get_task("promote").outlets] == [f"seqcls://models/{model}/champion"]
        assert dag.params["model_name"] == model and f"model:{model}" in dag.tags
        assert f"**Model `{model}`**" in dag.doc_md and dag.doc_md.startswith("# seqcls_release")
    assert [a.uri for a in alpha.schedule] == ["seqcls://checkpoints/alpha"]
    assert beta.schedule == "0 3 * * *" and default.schedule is None
    assert (alpha.params["threshold"], alpha.params["thresholds"], alpha.params["profile"]) == (
        0.6,
        {"体育##夺冠": 0.7},
        "fp32-fused",
    )
    assert (alpha.params["checkpoints_root"], beta.params["checkpoints_root"]) == ("alpha", "/data/checkpoints/beta")
    assert beta.params["mlflow_conn_id"] == "mlflow_beta" and default.params["threshold"] == 0.5
    # the default location: seqcls-models.yaml beside the DAG file
    folder = tmp_path / "dags"
    folder.mkdir()
    for py in DAGS.glob("*.py"):
        shutil.copy(py, folder)
    _write(folder / "seqcls-models.yaml", "models: [{name: gamma, schedule: '@daily'}]\n")
    bag = _bag(monkeypatch, None, folder)
    assert bag.import_errors == {} and sorted(bag.dags) == ["seqcls_release__gamma", "seqcls_sync"]


def test_a_bad_models_file_fails_the_parse_naming_file_model_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = _write(tmp_path / "models.yaml", "models: [{name: alpha}, {name: beta, params: {threshold: 1.5}}]\n")
    bag = _bag(monkeypatch, bad)
    ((file, error),) = bag.import_errors.items()
    assert file.endswith("seqcls_release.py") and "seqcls_release__alpha" not in bag.dags
    assert f"{bad}: model 'beta': params.threshold: threshold must be a number strictly between 0 and 1" in error
    cron = _write(tmp_path / "cron.yaml", "models: [{name: alpha, schedule: 'every day at 3'}]\n")
    error = next(iter(_bag(monkeypatch, cron).import_errors.values()))
    assert f"{cron}: model 'alpha': schedule 'every day at 3' is not a valid cron expression" in error


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_dag_releases_only_its_own_model(
    airflow_db: Path, tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    """alpha's DAG refuses model_name=beta (beta's lease, runs and champion Asset are beta's DAG's)."""
    bag = _bag(monkeypatch, EXAMPLE)
    dr, states = base._run(
        bag.dags["seqcls_release__alpha"], {"checkpoint": str(tiny_checkpoint), "model_name": "beta"}
    )
    assert dr.state == "failed" and states["resolve_checkpoint"] == "failed", states
    text = "".join(capfd.readouterr())
    assert "this DAG releases 'alpha', not model_name 'beta'" in text and "'seqcls_release__beta'" in text
