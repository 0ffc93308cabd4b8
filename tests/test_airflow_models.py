"""Several models, one DAG each, from one models file; the champion Asset; alpha and beta in parallel.

- the models file (``seqcls.airflow.models_file``): schema, strict validation, errors naming the file,
  the model and the key; the DAGs parsed from it (ids, schedules, Params defaults, outlets);
- the champion Asset: a consumer DAG scheduled on ``seqcls://models/<model>/champion`` is queued
  by a producer run's event and the scheduler's own asset-triggered run creation makes its run,
  consuming that event (no long-running scheduler: one pass of the code the scheduler loop runs);
- alpha and beta released through Airflow (``dag.test()`` of their DAGs, two processes at once)
  onto one Triton, each served and promoted under its own names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.airflow import (
    DAGS,
    TASKS,
    airflow_db,
    champion_events,
    champion_version,
    dag_test,
    private_airflow_home,
    ready_models,
    task_logs_reach_this_test,
    triton,
)

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow

# The Airflow fixtures of the DAG tests, shared (the session's migrated sqlite, Triton as a Connection).
__all__ = ["airflow_db", "task_logs_reach_this_test", "triton"]

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
    from seqcls.airflow.models_file import dag_id_for, load_models

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
    data = {"models": [{"name": "alpha", "params": {"atol": 0.00005}}]}
    (tmp_path / "m.json").write_text(json.dumps(data))
    _write(tmp_path / "m.toml", '[[models]]\nname = "alpha"\nparams = {atol = 0.00005}\n')
    (from_json,), (from_toml,) = load_models(tmp_path / "m.json"), load_models(tmp_path / "m.toml")
    assert from_json.params == from_toml.params and from_json.params["atol"] == 0.00005
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
            "models: [{name: alpha, params: {profile: fp8}}]\n",
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
    from seqcls.airflow.models_file import load_models
    from seqcls.errors import InputError

    path = tmp_path / "seqcls-models.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=expected) as info:
        load_models(path)
    assert str(info.value).startswith(str(path)), info.value


def test_models_file_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.airflow.models_file import models_file, release_models
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


def test_the_model_root_picks_where_checkpoints_come_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The models file's checkpoints_root (as the DAG file passes it to the tasks), never a run param."""
    from seqcls.airflow.context import settings_from_params
    from seqcls.airflow.roots import locate_checkpoint
    from seqcls.errors import InputError

    monkeypatch.setenv("SEQCLS_CHECKPOINTS_ROOT", str(tmp_path / "root"))
    assert settings_from_params({}).checkpoints_root == tmp_path / "root"
    assert settings_from_params({}, checkpoints_root="").checkpoints_root == tmp_path / "root"
    alpha = settings_from_params({}, checkpoints_root="alpha")
    assert alpha.checkpoints_root == tmp_path / "root" / "alpha"
    assert locate_checkpoint("run-1", alpha) == tmp_path / "root" / "alpha" / "run-1"
    with pytest.raises(InputError, match=r"checkpoint '\.\./beta/run-1' resolves to .*/root/beta/run-1, which is out"):
        locate_checkpoint("../beta/run-1", alpha)  # a sibling model's root is outside too
    assert settings_from_params({}, checkpoints_root=str(tmp_path / "b")).checkpoints_root == tmp_path / "b"
    with pytest.raises(InputError, match=r"checkpoints_root '\.\./x': '\.\.' is not allowed"):
        settings_from_params({}, checkpoints_root="../x")
    with pytest.raises(InputError, match=r"checkpoints_root 'alpha' is not a run param"):
        settings_from_params({"checkpoints_root": "alpha"})


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

    from seqcls.airflow.context import TASK_ORDER
    from seqcls.airflow.outcome import REPORT_TASK

    bag = _bag(monkeypatch, EXAMPLE)
    assert bag.import_errors == {}, bag.import_errors
    assert sorted(bag.dags) == ["seqcls_release", "seqcls_release__alpha", "seqcls_release__beta", "seqcls_sync"]
    alpha, beta, default = (bag.dags[f"seqcls_release{s}"] for s in ("__alpha", "__beta", ""))
    for dag, model in ((alpha, "alpha"), (beta, "beta"), (default, "seqcls")):
        assert set(dag.task_ids) == {*TASK_ORDER, REPORT_TASK} and dag.max_active_runs == 1 and dag.catchup is False
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
    # the checkpoints root: every task's parse-time argument, not a param of the trigger form
    for dag, root, shown in ((alpha, "alpha", "SEQCLS_CHECKPOINTS_ROOT/alpha"), (beta, "/data/checkpoints/beta", None)):
        assert "checkpoints_root" not in dag.params
        assert {t.task_id: t.op_kwargs["checkpoints_root"] for t in dag.tasks} == {
            t: root for t in (*TASK_ORDER, REPORT_TASK)
        }
        assert f"under this model's checkpoints root {shown or root}," in dag.params.get_param("checkpoint").description
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


def test_sync_follows_the_models_file_connections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.airflow.models_file import load_models, release_models, sync_groups

    default = {"triton_conn_id": "triton_default", "mlflow_conn_id": "mlflow_default"}
    monkeypatch.setenv("SEQCLS_MODELS_FILE", "none")
    assert sync_groups(release_models(tmp_path)) == [{**default, "models": None}]  # no file: all, as before
    shared = _write(tmp_path / "shared.yaml", "models: [{name: alpha}, {name: beta}]\n")
    assert sync_groups(load_models(shared)) == [{**default, "models": None}]  # one Triton, one MLflow: all
    # the example's beta mirrors its champion to another MLflow: each pair syncs its own models
    assert sync_groups(load_models(EXAMPLE)) == [
        {**default, "models": ["seqcls", "alpha"]},
        {**default, "mlflow_conn_id": "mlflow_beta", "models": ["beta"]},
    ]
    other = _write(tmp_path / "other.yaml", "models: [{name: alpha}, {name: beta, triton_conn_id: triton_b}]\n")
    assert sync_groups(load_models(other)) == [
        {**default, "models": None},
        {**default, "triton_conn_id": "triton_b", "models": None},
    ]
    # a models file that does not parse breaks the release DAGs, never the recovery DAG
    bag = _bag(monkeypatch, _write(tmp_path / "bad.yaml", "models: [{name: alpha, shedule: asset}]\n"))
    assert "seqcls_sync" in bag.dags and "seqcls_release__alpha" not in bag.dags and len(bag.import_errors) == 1


def test_a_dag_releases_only_its_own_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """alpha's DAG refuses model_name=beta (beta's lease, runs and champion Asset are beta's DAG's)."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    dag = _bag(monkeypatch, EXAMPLE).dags["seqcls_release__alpha"]
    resolve = dag.get_task("resolve_checkpoint")
    params = {**dag.params.dump(), "checkpoint": "/nowhere", "model_name": "beta"}  # refused before any look
    with pytest.raises(AirflowFailException, match=r"this DAG releases 'alpha', not model_name 'beta'.*__beta"):
        resolve.python_callable(**resolve.op_kwargs, params=params, dag_run=SimpleNamespace(run_type="manual"), ti=None)


def test_a_dag_takes_checkpoints_only_from_its_models_root(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """beta's DAG (root /…/beta-checkpoints) refuses alpha's checkpoint and a conf naming another root."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    roots = {"alpha": tmp_path / "checkpoints" / "alpha", "beta": tmp_path / "beta-checkpoints"}
    shutil.copytree(tiny_checkpoint, roots["alpha"] / "run-1")
    shutil.copytree(tiny_checkpoint, roots["beta"] / "run-1")
    models = _write(
        tmp_path / "models.yaml", f"models: [{{name: alpha}}, {{name: beta, checkpoints_root: {roots['beta']}}}]\n"
    )
    dag = _bag(monkeypatch, models, SEQCLS_CHECKPOINTS_ROOT=str(tmp_path / "checkpoints")).dags["seqcls_release__beta"]
    resolve = dag.get_task("resolve_checkpoint")
    import functools

    from seqcls.airflow import tasks

    # roots only: the preflight's Triton/MLflow checks are tested in test_airflow_dag and test_preflight
    monkeypatch.setattr(tasks, "preflight", functools.partial(tasks.preflight, servers=()))

    def run(**conf):
        params = {**dag.params.dump(), "skip_if_champion": False, **conf}
        manual, ti = SimpleNamespace(run_type="manual"), SimpleNamespace(xcom_push=lambda **_: None)
        return resolve.python_callable(**resolve.op_kwargs, params=params, dag_run=manual, ti=ti)

    assert run(checkpoint="run-1")["checkpoint"] == str((roots["beta"] / "run-1").resolve())

    alpha_run = roots["alpha"] / "run-1"
    with pytest.raises(AirflowFailException, match=rf"checkpoint '{alpha_run}' resolves to {alpha_run}, which is out"):
        run(checkpoint=str(alpha_run))
    with pytest.raises(AirflowFailException, match=r"checkpoints_root '.*checkpoints/alpha' is not a run param"):
        run(checkpoint="run-1", checkpoints_root=str(roots["alpha"]))


# ----------------------------------------------------------------------------- the champion Asset triggers consumers

#: A stand-in for the release DAG's promote (same Asset, same helper, no release behind it) and a
#: consumer scheduled on the champion URI as a downstream team would write it (by URI, by hand).
ASSET_DAGS = """
from datetime import UTC, datetime

from airflow.sdk import Asset, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from seqcls.airflow.assets import champion_asset, record_champion

MODEL = "{model}"
START = datetime(2025, 1, 1, tzinfo=UTC)


@dag(dag_id="seqcls_test_promote_stand_in", schedule=None, start_date=START, catchup=False)
def promote_stand_in():
    @task(outlets=[champion_asset(MODEL)])
    def promote(params=None, outlet_events=None):
        if params["skip"]:  # what a run that is already champion does: promote is skipped
            raise AirflowSkipException("already champion")
        summary = {{"model_name": MODEL, "version": 4, "triton_version": 9, "fingerprint": "{fingerprint}"}}
        return record_champion(outlet_events, MODEL, summary)

    promote()


@dag(
    dag_id="seqcls_test_champion_consumer",
    schedule=[Asset(uri="seqcls://models/{model}/champion")],
    start_date=START,
    catchup=False,
)
def champion_consumer():
    @task
    def deploy_downstream(triggering_asset_events=None):
        return [e.extra for events in triggering_asset_events.values() for e in events]

    deploy_downstream()


promote_stand_in()
champion_consumer()
"""
PRODUCER, CONSUMER = "seqcls_test_promote_stand_in", "seqcls_test_champion_consumer"


def _queued_for(dag_id: str) -> list[str]:
    """The AssetDagRunQueue: which assets have an event the DAG has not consumed yet."""
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri)
            .join(AssetDagRunQueue, AssetDagRunQueue.asset_id == AssetModel.id)
            .where(AssetDagRunQueue.target_dag_id == dag_id)
        )
        return sorted(uri for (uri,) in rows)


def _scheduler_creates_asset_triggered_runs() -> None:
    """One pass of what the scheduler loop does to start DAG runs (``_create_dagruns_for_dags``),
    under the scheduler's commit guard: finds the DAGs whose asset condition is met and creates
    their asset-triggered runs, consuming the queued events."""
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.utils.session import create_session
    from airflow.utils.sqlalchemy import prohibit_commit

    runner = SchedulerJobRunner(job=Job(), executors=[])
    with create_session() as session, prohibit_commit(session) as guard:
        runner._create_dagruns_for_dags(guard, session)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_champion_event_triggers_a_consumer_dag(airflow_db: Path, tmp_path: Path, monkeypatch) -> None:
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from seqcls.airflow.assets import champion_asset

    t0 = time.perf_counter()
    model, fingerprint = "gamma", "c0ffee" * 10 + "beef"
    uri = champion_asset(model).uri
    folder = tmp_path / "asset-dags"
    folder.mkdir()
    _write(folder / "champion_dags.py", ASSET_DAGS.format(model=model, fingerprint=fingerprint))
    # What the dag-processor does: parse the folder and write the DAGs (their asset references) to the DB.
    bag = BundleDagBag(dag_folder=str(folder), bundle_path=folder, bundle_name="dags-folder")
    assert bag.import_errors == {} and sorted(bag.dags) == [CONSUMER, PRODUCER], bag.import_errors
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    with create_session() as session:  # DAGs are created paused; a consumer is switched on by its team
        session.get(DagModel, CONSUMER).is_paused = False
    before = len(champion_events(uri))

    # 1. promote skipped (already champion): no event, nothing queued, no consumer run
    dr = dag_test(bag.dags[PRODUCER], run_conf={"skip": True})
    assert dr.state == "success" and {t.task_id: t.state for t in dr.get_task_instances()} == {"promote": "skipped"}
    assert len(champion_events(uri)) == before and _queued_for(CONSUMER) == []
    _scheduler_creates_asset_triggered_runs()
    with create_session() as session:
        assert session.scalars(select(DagRun).where(DagRun.dag_id == CONSUMER)).all() == []

    # 2. promote succeeds: one event with the release's extra, the consumer queued on it
    dr = dag_test(bag.dags[PRODUCER], run_conf={"skip": False})
    assert dr.state == "success", dr.state
    events = champion_events(uri)[before:]
    assert [(e["extra"], e["dag_id"], e["run_id"]) for e in events] == [
        ({"version": 4, "triton_version": 9, "fingerprint": fingerprint}, PRODUCER, dr.run_id)
    ]
    assert _queued_for(CONSUMER) == [uri]

    # 3. the scheduler's own asset-triggered run creation starts the consumer, consuming that event
    _scheduler_creates_asset_triggered_runs()
    with create_session() as session:
        (run,) = session.scalars(select(DagRun).where(DagRun.dag_id == CONSUMER)).all()
        assert str(run.run_type) in ("asset_triggered", "DagRunType.ASSET_TRIGGERED"), run.run_type
        assert str(run.state) in ("queued", "DagRunState.QUEUED")
        assert [e.id for e in run.consumed_asset_events] == [events[0]["id"]]
        assert run.consumed_asset_events[0].extra["fingerprint"] == fingerprint
    assert _queued_for(CONSUMER) == []
    print(f"\nconsumer triggered in {time.perf_counter() - t0:.1f}s", file=sys.__stderr__)


# ----------------------------------------------------------------------------- alpha and beta at the same time

#: One model's release in its own process, as a worker would run it: parse the DAG folder (the
#: models file from SEQCLS_MODELS_FILE), ``dag.test()`` the model's DAG, print the outcome as JSON.
RUN_ONE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(dag_folder=sys.argv[1])
assert not bag.import_errors, bag.import_errors
t0 = time.time()
dr = bag.dags[sys.argv[2]].test(run_conf=json.loads(sys.argv[3]))
tasks = {
    ti.task_id: [str(getattr(ti.state, "value", ti.state)), ti.start_date and ti.start_date.timestamp(),
                 ti.end_date and ti.end_date.timestamp()]
    for ti in dr.get_task_instances()
}
state = str(getattr(dr.state, "value", dr.state))
out = {"state": state, "run_id": dr.run_id, "tasks": tasks, "start": t0, "end": time.time()}
print("SEQCLS-RESULT " + json.dumps(out))
"""


def _sync_dags_folder() -> None:
    """Write the DAGs to the DB once, before two processes' ``dag.test()`` re-sync the same rows."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = BundleDagBag(dag_folder=str(DAGS), bundle_path=DAGS, bundle_name="dags-folder")
    assert bag.import_errors == {}, bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)


def _infer(server, ensemble: str, text: str) -> list[dict]:
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=server.config.grpc_url)
    inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=object))
    out = client.infer(ensemble, [inp], outputs=[grpcclient.InferRequestedOutput("predictions")])
    return json.loads(out.as_numpy("predictions")[0][0])


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_alpha_and_beta_release_concurrently_through_airflow(
    airflow_db: Path,
    triton,
    tiny_checkpoint_src: Path,
    tiny_checkpoint_b_src: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from seqcls.contract.names import CLASSIC, ModelName
    from seqcls.release.intake import resolve_checkpoint

    # alpha's checkpoints under $SEQCLS_CHECKPOINTS_ROOT/alpha (the default), beta's in a root of its own
    roots = {"alpha": tmp_path / "checkpoints" / "alpha", "beta": tmp_path / "beta-checkpoints"}
    for root, src in zip(roots.values(), (tiny_checkpoint_src, tiny_checkpoint_b_src), strict=True):
        shutil.copytree(src, root / "run-1")
    models = _write(
        tmp_path / "seqcls-models.yaml",
        f"""
        models:
          - name: alpha
          - name: beta
            checkpoints_root: {roots["beta"]}
        """,
    )
    for key, value in {
        "SEQCLS_MODELS_FILE": str(models),
        "SEQCLS_CHECKPOINTS_ROOT": str(tmp_path / "checkpoints"),
    }.items():
        monkeypatch.setenv(key, value)
    for var in ("SEQCLS_SCHEDULE", "SEQCLS_MODEL_NAME", "SEQCLS_PADDLE_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    _sync_dags_folder()
    before = {m: len(champion_events(f"seqcls://models/{m}/champion")) for m in roots}

    t0 = time.perf_counter()
    logs, procs = {}, {}
    for model in roots:  # both at once: each DAG has max_active_runs=1 and its own lease; nothing is shared
        logs[model] = (tmp_path / f"{model}.log").open("w")
        cmd = [
            sys.executable,
            "-c",
            RUN_ONE,
            str(DAGS),
            f"seqcls_release__{model}",
            json.dumps({"checkpoint": "run-1"}),
        ]
        procs[model] = subprocess.Popen(cmd, stdout=logs[model], stderr=subprocess.STDOUT, env=os.environ.copy())
    codes = {m: p.wait(timeout=840) for m, p in procs.items()}
    wall = time.perf_counter() - t0
    results = {}
    for model in roots:
        logs[model].close()
        text = (tmp_path / f"{model}.log").read_text(errors="replace")
        line = next((ln for ln in text.splitlines() if ln.startswith("SEQCLS-RESULT ")), None)
        assert codes[model] == 0 and line, f"{model}: exit {codes[model]}\n{text[-4000:]}"
        results[model] = json.loads(line.removeprefix("SEQCLS-RESULT "))
    for model, r in results.items():
        tasks = r["tasks"]
        timing = ", ".join(f"{t} {(tasks[t][2] or 0) - (tasks[t][1] or 0):.1f}s" for t in TASKS if t in tasks)
        print(f"\n{model}: {r['state']} in {r['end'] - r['start']:.0f}s: {timing}", file=sys.__stderr__)
    states = {m: {t: v[0] for t, v in r["tasks"].items()} for m, r in results.items()}
    expected = {**{t: "success" for t in TASKS}, "rollback": "skipped", "report_outcome": "success"}
    assert states == {"alpha": expected, "beta": expected}, states
    # they really ran at the same time: the two runs overlap for most of their length
    overlap = min(r["end"] for r in results.values()) - max(r["start"] for r in results.values())
    shortest = min(r["end"] - r["start"] for r in results.values())
    serving = {m: (r["tasks"]["publish_repository"][1], r["tasks"]["promote"][2]) for m, r in results.items()}
    on_triton = min(e for _, e in serving.values()) - max(s for s, _ in serving.values())
    print(
        f"alpha ∥ beta: wall {wall:.0f}s, runs overlap {overlap:.0f}s, publish..promote {on_triton:.1f}s",
        file=sys.__stderr__,
    )
    assert overlap > 0.5 * shortest, (overlap, shortest)

    # one Triton serves both, each under its own names, version 1; nothing under the classic names
    ready = ready_models(triton)
    for model in roots:
        assert {n: ready.get(n) for n in ModelName(model).names.models} == {
            n: ["1"] for n in ModelName(model).names.models
        }, ready
        assert isinstance(_infer(triton, ModelName(model).names.ensemble, "凌云航空确认裁员"), list)
    assert not set(ready) & set(CLASSIC.all), ready
    # each promoted alone: its own champion in MLflow and its own champion Asset event
    for model, root in roots.items():
        fingerprint = resolve_checkpoint(root / "run-1").fingerprint
        champion = champion_version(model)
        assert int(champion.version) == 1 and champion.tags["fingerprint"] == fingerprint
        events = champion_events(f"seqcls://models/{model}/champion")[before[model] :]
        assert [(e["extra"], e["dag_id"], e["run_id"]) for e in events] == [  # and its own champion event
            (
                {"version": 1, "triton_version": 1, "fingerprint": fingerprint},
                f"seqcls_release__{model}",
                results[model]["run_id"],
            )
        ]
    # the recovery DAG, reading the same models file, finds both in sync
    from airflow.dag_processing.dagbag import DagBag

    run = dag_test(DagBag(dag_folder=str(DAGS)).dags["seqcls_sync"])
    assert run.state == "success", run.state
    (ti,) = run.get_task_instances()
    assert {r["model_name"] for r in ti.xcom_pull(task_ids="sync_models")} == set(roots)
