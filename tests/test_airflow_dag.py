"""The seqcls_release DAG on a real Airflow 3 (sqlite, migrated once), a real local Triton and MLflow.

Airflow reads its configuration once per process, at first import, so this module points it at
a private AIRFLOW_HOME before anything imports airflow (never ~/airflow). Runs use ``dag.test()``
(tasks in this process, no scheduler): its DagRun state and per-task states are asserted, the
task logs (captured output) must tell the story with figures.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.airflow import (
    DAG_ID,
    DAGS,
    PLUGINS,
    ROOT,
    SYNC_DAG_ID,
    TASKS,
    airflow_cli,
    airflow_db,
    champion_events,
    champion_version,
    dag_test,
    parse_dag,
    private_airflow_home,
    ready_models,
    run_dag,
    task_logs_reach_this_test,
    tasks_between,
    triton,
)
from tests.helpers.receivers import json_receiver, wait_for

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow
# the fixtures, imported for this module's tests
__all__ = ["airflow_db", "json_receiver", "task_logs_reach_this_test", "triton"]
REPORT_TASK = "report_outcome"  # seqcls.airflow.outcome.REPORT_TASK (imports Airflow: not at module level)


# ----------------------------------------------------------------------------- fast: no services


def test_params_map_to_release_config_and_name_the_bad_one(tmp_path: Path) -> None:
    from seqcls.airflow.context import config_from_params, settings_from_params
    from seqcls.airflow.roots import locate_checkpoint
    from seqcls.errors import InputError

    cfg = config_from_params({"checkpoint": "latest", "model_name": "m1", "thresholds": '{"体育": 0.7}', "opset": 15})
    assert (cfg.model_name, cfg.opset, cfg.thresholds) == ("m1", 15, {"体育": 0.7})
    for bad, name in (({"model_name": "../evil"}, "model name"), ({"atol": 2}, "atol"), ({"nope": 1}, "nope")):
        with pytest.raises(InputError, match=name):
            config_from_params(bad)
    settings = settings_from_params({}, checkpoints_root=tmp_path)
    assert locate_checkpoint("run-7", settings) == tmp_path.resolve() / "run-7"
    with pytest.raises(InputError, match=r"checkpoint '\.\./outside' resolves to .*, which is outside"):
        locate_checkpoint("../outside", settings)


def test_a_checkpoint_must_resolve_under_the_model_root(tmp_path: Path) -> None:
    """Issue 13: whoever triggers a run picks a checkpoint *under* the deployment's root, never any path."""
    from seqcls.airflow.context import config_from_params, settings_from_params
    from seqcls.airflow.roots import LATEST, locate_checkpoint
    from seqcls.errors import InputError
    from seqcls.release.completion import mark_complete
    from tests.helpers.checkpoints import minimal_checkpoint

    root = (tmp_path / "root").resolve()
    inside = minimal_checkpoint(root / "run-1")
    outside = minimal_checkpoint(tmp_path / "elsewhere")
    settings = settings_from_params({}, checkpoints_root=root)
    # inside: relative, absolute, a '..' that stays inside, a symlink within the root → the real directory
    (root / "alias").symlink_to(inside, target_is_directory=True)
    for given in ("run-1", str(inside), "run-1/../run-1", "alias"):
        assert locate_checkpoint(given, settings) == inside, given
    # outside: an absolute path, a '..' escape, a symlink under the root pointing out
    (root / "link").symlink_to(outside, target_is_directory=True)
    for given in (str(outside), "../elsewhere", f"{root}/../elsewhere", "link"):
        with pytest.raises(InputError) as info:
            locate_checkpoint(given, settings)
        message = str(info.value)
        assert message.startswith(f"checkpoint {given!r} resolves to {outside}, which is outside"), message
        assert f"checkpoints root {root}" in message and "copy the checkpoint under that root" in message
        assert "ask an operator to set this model's checkpoints_root" in message
    # 'latest' whose newest completed candidate is a symlink leaving the root: refused, not followed
    mark_complete(inside)
    assert locate_checkpoint(LATEST, settings) == inside
    (root / "alias").unlink()
    mark_complete(outside)  # newer than run-1
    with pytest.raises(
        InputError,
        match=r"checkpoint 'latest' resolves to .*elsewhere, which is outside .* "
        r"\('latest' under .* is .*/link: a symlink leaving the root\)",
    ):
        locate_checkpoint(LATEST, settings)
    # the run conf cannot choose (or widen) the root
    for call in (config_from_params, settings_from_params):
        with pytest.raises(InputError, match=r"checkpoints_root '/' is not a run param: .* set by the deployment"):
            call({"checkpoint": "run-1", "checkpoints_root": "/"})


def test_hooks_read_connections_and_fall_back_to_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from seqcls.airflow.hooks import MlflowHook, TritonHook
    from seqcls.airflow.tasks import task_settings
    from seqcls.errors import InputError

    monkeypatch.setenv(
        "AIRFLOW_CONN_TRITON_DEFAULT",
        json.dumps({"conn_type": "generic", "extra": {"grpc_endpoints": "a:1, b:2", "http_endpoints": "a:3,b:4"}}),
    )
    monkeypatch.setenv("AIRFLOW_CONN_TRITON_ONE", json.dumps({"conn_type": "generic", "host": "t", "port": 9001}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_TRITON_BAD", json.dumps({"extra": {"grpc_endpoints": "a:1", "http_endpoints": "a:3,b:4"}})
    )
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({"conn_type": "generic", "host": "ml", "port": 5000}))
    hook = TritonHook()
    assert [(e.grpc, e.http) for e in hook.endpoints()] == [("a:1", "a:3"), ("b:2", "b:4")]
    assert [ops.endpoint for ops in hook.get_conn()] == hook.endpoints()  # the real client, one per replica
    assert [e.grpc for e in TritonHook("triton_one").endpoints()] == ["t:9001"]
    assert TritonHook("triton_one", grpc=["x:1"]).configured_endpoints[0].grpc == "x:1"  # arguments beat the connection
    with pytest.raises(InputError, match="one of each per Triton replica"):
        TritonHook("triton_bad").endpoints()
    assert MlflowHook().tracking_uri == "http://ml:5000"
    # a missing connection: settings defaults (the local embedded setup)
    assert TritonHook("nope").settings_overrides() == {
        "triton_grpc": None,
        "triton_http": None,
        "triton_repository": None,
        "triton_control_key": None,
    }
    # the password is Triton's model-control key; a dns:/// endpoint is one Endpoint per replica
    key = "k" * 32
    monkeypatch.setenv(
        "AIRFLOW_CONN_TRITON_KEYED",
        json.dumps({"conn_type": "generic", "password": key, "extra": {"grpc_endpoints": "dns:///pods:8001"}}),
    )
    monkeypatch.setenv("SEQCLS_TRITON_RESOLVE", "pods=10.0.0.1,10.0.0.2")
    keyed = TritonHook("triton_keyed").endpoints()
    assert [e.grpc for e in keyed] == ["10.0.0.1:8001", "10.0.0.2:8001"]
    assert all(e.control_key == key for e in keyed) and key not in repr(keyed)
    settings = task_settings({"triton_conn_id": "nope", "mlflow_conn_id": "nope"})
    assert settings.triton_grpc == ("127.0.0.1:8001",) and str(settings.mlflow_tracking_uri).startswith("sqlite:///")
    settings = task_settings({"runtime": "onnxruntime"})  # a serving-spec param: not the task's settings
    assert settings.triton_grpc == ("a:1", "b:2") and settings.mlflow_tracking_uri == "http://ml:5000"
    assert settings.runtime == "python-onnxruntime"


def test_mlflow_credentials_come_from_connection_fields_masked_and_scoped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13: login/password/token → MLflow's own variables for the block only, masked; never in the URI."""
    from airflow.sdk._shared.secrets_masker import redact  # what airflow.sdk.log.mask_secret feeds

    from seqcls.airflow.hooks import MlflowHook, TritonHook
    from seqcls.airflow.tasks import connected
    from seqcls.errors import InputError
    from seqcls.registry.ledger import tracking_uri
    from seqcls.settings import MLFLOW_CREDENTIAL_VARS, Settings

    conns = {
        "MLFLOW_BASIC": {
            "conn_type": "generic",
            "host": "ml",
            "port": 5000,
            "login": "rel",
            "password": "pw-basic-123",
        },
        "MLFLOW_TOKEN": {"conn_type": "generic", "host": "ml", "extra": {"token": "tok-extra-456"}},
        "MLFLOW_BEARER": {"conn_type": "generic", "host": "ml", "password": "tok-password-789"},
        "MLFLOW_URI_CREDS": {"conn_type": "generic", "extra": {"tracking_uri": "https://rel:pw-in-uri@ml.example/"}},
        "MLFLOW_HOST_CREDS": {"conn_type": "generic", "host": "rel:pw-in-host@ml", "port": 5000},
        "TRITON_KEYED": {"conn_type": "generic", "host": "t", "port": 9001, "password": "triton-key-0123456789"},
    }
    for name, conn in conns.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{name}", json.dumps(conn))
    username, password, token = MLFLOW_CREDENTIAL_VARS
    monkeypatch.setenv(token, "the-worker-s-own-token")  # the environment's own, kept when a Connection has none
    hook = MlflowHook("mlflow_basic")
    assert hook.tracking_uri == "http://ml:5000"
    assert hook.credentials_env() == {username: "rel", password: "pw-basic-123", token: None}
    assert MlflowHook("mlflow_token").credentials_env() == {username: None, password: None, token: "tok-extra-456"}
    assert MlflowHook("mlflow_bearer").credentials_env() == {username: None, password: None, token: "tok-password-789"}
    assert MlflowHook("nope").credentials_env() == {}
    # every secret the hooks read is masked in logs (the Triton password is the model-control key)
    TritonHook("triton_keyed").connection  # noqa: B018 — reading it registers the mask
    for secret in ("pw-basic-123", "tok-extra-456", "tok-password-789", "triton-key-0123456789"):
        assert redact(f"x {secret} y") == "x *** y", secret
    # in the environment only while the block runs, then the worker's own again
    with connected({"mlflow_conn_id": "mlflow_basic", "triton_conn_id": "nope"}) as settings:
        assert settings.mlflow_tracking_uri == "http://ml:5000"
        assert (os.environ[username], os.environ[password], os.environ.get(token)) == ("rel", "pw-basic-123", None)
    assert username not in os.environ and password not in os.environ
    assert os.environ[token] == "the-worker-s-own-token"
    # credentials in a URI are refused, saying where they go, without echoing them
    for conn_id in ("mlflow_uri_creds", "mlflow_host_creds"):
        with pytest.raises(
            InputError, match=rf"embeds credentials .*connection '{conn_id}''s login and password"
        ) as info:
            MlflowHook(conn_id).tracking_uri  # noqa: B018
        assert "pw-in" not in str(info.value) and "***@ml" in str(info.value)
    with pytest.raises(
        InputError, match=r"embeds credentials .*set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD"
    ):
        tracking_uri(Settings(mlflow_tracking_uri="http://rel:pw-env@ml:5000"))
    assert tracking_uri(Settings(mlflow_tracking_uri="sqlite:////tmp/a@b/mlflow.db")).endswith("a@b/mlflow.db")


# ----------------------------------------------------------------------------- parse + plugin


@pytest.mark.slow
def test_dag_imports_with_the_release_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import TriggerRule

    from seqcls.airflow import outcome

    dag = parse_dag(monkeypatch, SEQCLS_SCHEDULE=None, SEQCLS_PADDLE_PYTHON=None)
    assert REPORT_TASK == outcome.REPORT_TASK
    assert tuple(t.task_id for t in dag.topological_sort()) == (*TASKS, REPORT_TASK)
    assert dag.get_task(REPORT_TASK).is_teardown and dag.get_task(REPORT_TASK).upstream_task_ids == set(TASKS)
    assert dag.schedule is None and dag.catchup is False and dag.max_active_runs == 1
    assert dag.doc_md and "seqcls_release" in dag.doc_md
    assert dag.get_task("rollback").trigger_rule == TriggerRule.ONE_FAILED
    assert dag.get_task("rollback").upstream_task_ids == {
        "register_model",
        "publish_repository",
        "reload_triton",
        "smoke_test",
        "expose_version",
    }
    assert dag.get_task("export_static").upstream_task_ids == {"resolve_checkpoint"}
    assert type(dag.get_task("export_static")).__name__ == "_PythonDecoratedOperator"
    for name, param in dag.params.items():
        assert param.schema.get("title"), f"param {name} has no title for the trigger form"
    assert dag.params["checkpoint"] == "latest" and dag.params["triton_conn_id"] == "triton_default"
    # schedule and interpreter are chosen by env at parse time
    dag = parse_dag(monkeypatch, SEQCLS_SCHEDULE="asset", SEQCLS_PADDLE_PYTHON=sys.executable)
    assert [a.uri for a in dag.schedule] == ["seqcls://checkpoints/seqcls"]
    assert type(dag.get_task("export_static")).__name__ == "_PythonExternalDecoratedOperator"
    assert dag.get_task("export_static").python == sys.executable
    dag = parse_dag(monkeypatch, SEQCLS_SCHEDULE="0 3 * * *", SEQCLS_PADDLE_PYTHON=None)
    assert dag.schedule == "0 3 * * *" and type(dag.timetable).__name__ == "CronTriggerTimetable"


def test_sync_dag_runs_every_few_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    sync_dag = bag.dags[SYNC_DAG_ID]
    assert sync_dag.schedule == timedelta(minutes=5) and sync_dag.catchup is False and sync_dag.max_active_runs == 1
    assert [t.task_id for t in sync_dag.tasks] == ["sync_models"] and "seqcls sync" in sync_dag.doc_md


@pytest.mark.slow
def test_plugin_is_listed_without_import_errors() -> None:
    """Registered once, by the installed package's ``airflow.plugins`` entry point — not by the plugins folder
    (the tests point it at ``plugins/``, the package's source tree: its .airflowignore keeps the scan out)."""
    out = airflow_cli("plugins", "-o", "json", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    listed = json.loads(out.stdout[out.stdout.index("[") :])
    assert [p["name"] for p in listed].count("seqcls") == 1, listed
    plugins = {p["name"]: p for p in listed}
    assert plugins["seqcls"]["source"].startswith("seqcls=="), plugins["seqcls"]["source"]
    assert "EntryPoint(name='seqcls', value='seqcls.airflow.plugin:SeqclsPlugin'" in plugins["seqcls"]["source"]
    links = " ".join(plugins["seqcls"]["global_operator_extra_links"])
    assert "MlflowModelVersionLink" in links and "TritonModelLink" in links
    assert not (PLUGINS / "seqcls_plugin.py").exists(), "the plugins-folder shim is gone"
    code = (
        "import json; from airflow import plugins_manager as pm, settings as s; p, e = pm._get_plugins();"
        "print(json.dumps({'folder': s.PLUGINS_FOLDER, 'names': [x.name for x in p], 'errors': e}))"
    )
    # also with providers discovered eagerly: their plugins are loaded too, and must not repeat the entry point's
    env = {**os.environ, "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["folder"] == str(PLUGINS) and loaded["errors"] == {}, loaded
    assert loaded["names"].count("seqcls") == 1, loaded


# ----------------------------------------------------------------------------- runs (dag.test)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_release_skip_then_smoke_failure_rolls_back(
    airflow_db: Path,
    triton,
    tiny_checkpoint: Path,
    tiny_checkpoint_b: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    json_receiver,
) -> None:
    from seqcls.contract.names import ENSEMBLE, MODELS, ModelName
    from seqcls.serving.repository import Repository
    from seqcls.settings import PROJECT_ROOT, Settings

    root = tmp_path / "checkpoints"
    ckpt_a = root / "run-a"
    shutil.copytree(tiny_checkpoint, ckpt_a)
    monkeypatch.setenv("SEQCLS_CHECKPOINTS_ROOT", str(root))
    # report_outcome tells every outcome to this URL (no models file: SEQCLS_NOTIFY_URLS, read at parse time)
    dag = parse_dag(monkeypatch, SEQCLS_PADDLE_PYTHON=None, SEQCLS_NOTIFY_URLS=json_receiver.url())

    champion_uri = "seqcls://models/seqcls/champion"
    before = len(champion_events(champion_uri))  # the session's Airflow DB is shared by the Airflow tests

    # 1. a full release: Triton serves version 1, MLflow champion is it, the logs tell the story
    dr, states = run_dag(dag, {"checkpoint": str(ckpt_a)})
    assert dr.state == "success", states
    assert states == {**{t: "success" for t in TASKS}, "rollback": "skipped", REPORT_TASK: "success"}
    assert ready_models(triton) == {m: ["1"] for m in MODELS}
    settings = Settings.from_env(triton_repository=triton.config.repository)
    assert Repository.from_settings(settings, ModelName("seqcls")).serving_version() == 1
    champion = champion_version()
    from seqcls.release.intake import resolve_checkpoint

    fp_a = resolve_checkpoint(ckpt_a).fingerprint
    assert champion is not None and int(champion.version) == 1 and champion.tags["fingerprint"] == fp_a
    (note,) = wait_for(json_receiver, 1)
    assert (note.title, note.kind) == ("[seqcls] seqcls: Triton v1 (MLflow v1) promoted", "success")
    assert f"fingerprint {fp_a[:12]}, checkpoint {ckpt_a}" in note.body and "gates: parity passed" in note.body
    assert f"/dags/{DAG_ID}/runs/" in note.body  # the Airflow run's link
    # promote emitted the champion Asset, its extra naming what is served now
    assert [(e["extra"], e["dag_id"], e["run_id"]) for e in champion_events(champion_uri)[before:]] == [
        ({"version": 1, "triton_version": 1, "fingerprint": fp_a}, DAG_ID, dr.run_id)
    ]
    logs = capfd.readouterr()
    text = logs.out + logs.err
    for line in (
        "manual run releases",
        "export: ok in",
        "convert figures: opset=14",
        "validate figures: provider=CPUExecutionProvider, texts=65",
        "logits_max_abs_diff=",
        "register: ok in",
        "publish: ok in",
        "reload: ok in",
        "smoke figures: version=1, texts=65, p50_ms=",
        "promote: ok in",
        "champion → seqcls Triton v1 (MLflow v1)",
        f"publish link: http://{triton.config.http_url.split('://')[-1]}/v2/models/{ENSEMBLE}/versions/1",
    ):
        assert line in text, f"task logs lack {line!r}"
    # the plugin's extra link reads the URL the task pushed (as the API server does)
    from seqcls.airflow.plugin import MlflowModelVersionLink, TritonModelLink

    ti = next(t for t in dr.get_task_instances() if t.task_id == "reload_triton")
    assert TritonModelLink().get_link(dag.get_task("reload_triton"), ti_key=ti.key).endswith("/versions/1")
    assert MlflowModelVersionLink().get_link(dag.get_task("reload_triton"), ti_key=ti.key) == ""
    from urllib.parse import quote

    from seqcls.airflow.plugin import ParityEvidenceLink

    vti = next(t for t in dr.get_task_instances() if t.task_id == "validate_parity")
    evidence = ParityEvidenceLink().get_link(dag.get_task("validate_parity"), ti_key=vti.key)
    assert evidence.endswith(f"/seqcls/parity/{dag.dag_id}/{quote(vti.run_id, safe='')}"), evidence

    # 2. what a scheduled run does — `latest`, already champion — ends with every task skipped
    dr, states = run_dag(dag, {})
    assert dr.state == "success" and set(states.values()) == {"skipped"}, states
    skipped_log = "".join(capfd.readouterr())
    assert "nothing to release — every task is skipped: checkpoint" in skipped_log  # in the log, not only Post Execute
    assert "is already the MLflow champion" in skipped_log
    assert len(champion_events(champion_uri)) == before + 1  # a skipped run emits nothing
    assert len(json_receiver.received) == 1  # and tells nothing: report_outcome is skipped too
    # a real scheduled / asset-triggered run ignores the checkpoint and skip_if_champion params
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowSkipException

    resolve = dag.get_task("resolve_checkpoint").python_callable
    for run_type in ("scheduled", "asset_triggered"):
        with pytest.raises(AirflowSkipException, match="already the MLflow champion"):
            resolve(
                checkpoints_root=dag.get_task("resolve_checkpoint").op_kwargs["checkpoints_root"],
                params={**dag.params.dump(), "checkpoint": "/nowhere", "skip_if_champion": False},
                dag_run=SimpleNamespace(run_type=run_type),
                ti=None,
            )

    # 3. a release whose served answers differ: smoke fails → rollback → version 1 serves again
    def negate(src: Path) -> None:
        p = src / "seqcls_postprocess" / "model.py"
        p.write_text(p.read_text().replace("seqcls_decide.sigmoid(logits)", "seqcls_decide.sigmoid(-logits)"))

    broken = tmp_path / "broken_source"
    shutil.copytree(PROJECT_ROOT / "model_repository", broken)
    negate(broken)
    monkeypatch.setenv("SEQCLS_MODEL_REPOSITORY_SOURCE", str(broken))
    shutil.copytree(tiny_checkpoint_b, root / "run-b")  # only now: it must not be `latest` in step 2
    dr, states = run_dag(dag, {"checkpoint": "run-b"})
    assert dr.state == "failed", states
    assert states == {
        **{t: "success" for t in tasks_between(None, "smoke_test")},
        "smoke_test": "failed",
        "expose_version": "upstream_failed",
        "promote": "upstream_failed",
        "rollback": "success",
        REPORT_TASK: "success",  # a teardown: the run still ends failed
    }
    assert ready_models(triton) == {m: ["1"] for m in MODELS}
    assert Repository.from_settings(settings, ModelName("seqcls")).serving_version() == 1
    champion = champion_version()
    assert int(champion.version) == 1 and champion.tags["fingerprint"] == fp_a
    assert len(champion_events(champion_uri)) == before + 1  # nor does a failed one
    text = "".join(capfd.readouterr())
    assert "smoke test of seqcls Triton v2 failed" in text
    assert "rollback: ok in" in text and "serving Triton v1 again" in text
    note = wait_for(json_receiver, 2)[-1]
    assert (note.title, note.kind) == ("[seqcls] seqcls: release failed at smoke_test; candidate withdrawn", "failure")
    assert note.body.startswith("smoke test of seqcls Triton v2 failed: ")  # the reason first
    assert "serving now: Triton v1 (MLflow v1)" in note.body and "rollback: this attempt was undone" in note.body

    # 4. Triton restarts (explicit mode comes back empty): the seqcls_sync DAG serves version 1 again
    triton.stop()
    triton.start()
    assert ready_models(triton) == {}
    from airflow.dag_processing.dagbag import DagBag

    sync_dag = DagBag(dag_folder=str(DAGS)).dags[SYNC_DAG_ID]
    run = dag_test(sync_dag)
    assert run.state == "success", run.state
    assert ready_models(triton) == {m: ["1"] for m in MODELS}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_parity_failure_in_external_python_registers_and_publishes_nothing(
    airflow_db: Path, triton, tiny_checkpoint: Path, home: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    # Heavy steps in another interpreter (here: this venv's, where seqcls is installed).
    monkeypatch.setenv("SEQCLS_CHECKPOINTS_ROOT", str(tiny_checkpoint.parent))
    dag = parse_dag(monkeypatch, SEQCLS_PADDLE_PYTHON=sys.executable)
    # An editor padded a vocab line: PaddleNLP keeps "公 ", the serving tokenizer trims it.
    vocab = (tiny_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[vocab.index("公")] = "公 "
    (tiny_checkpoint / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")

    dr, states = run_dag(dag, {"checkpoint": str(tiny_checkpoint)})
    assert dr.state == "failed", states
    assert states == {
        "resolve_checkpoint": "success",
        "export_static": "success",
        "convert_onnx": "success",
        "validate_parity": "failed",
        **{t: "upstream_failed" for t in tasks_between("validate_parity", "rollback")},
        "rollback": "skipped",
        REPORT_TASK: "success",
    }
    text = "".join(capfd.readouterr())
    assert "Executing cmd: " + sys.executable in text  # really ran in the external interpreter
    assert "tokenizer ids differ on" in text
    from seqcls.registry.ledger import client
    from seqcls.settings import Settings

    assert client(Settings.from_env()).search_registered_models() == []
    repo = Settings.from_env().triton_repository
    assert not repo.exists() or not any(repo.iterdir())


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_bad_params_fail_before_any_work(
    airflow_db: Path, tiny_checkpoint: Path, home: Path, monkeypatch: pytest.MonkeyPatch, capfd, json_receiver
) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = parse_dag(monkeypatch, SEQCLS_PADDLE_PYTHON=None, SEQCLS_NOTIFY_URLS=json_receiver.url())
    with pytest.raises(ParamValidationError, match="opset"):  # the trigger form's schema
        dag.test(run_conf={"checkpoint": str(tiny_checkpoint), "opset": 99})
    # passes the schema, refused by the library: no path traversal through the model name
    dr, states = run_dag(dag, {"checkpoint": str(tiny_checkpoint), "model_name": "x..y"})
    assert dr.state == "failed"
    assert states == {
        "resolve_checkpoint": "failed",
        **{t: "upstream_failed" for t in tasks_between("resolve_checkpoint", "rollback")},
        "rollback": "skipped",
        REPORT_TASK: "success",
    }
    assert "bad release input: model name 'x..y' is not allowed" in "".join(capfd.readouterr())
    note = wait_for(json_receiver, 1)[0]  # the refusal, told with its reason (the first run that ran)
    assert (note.title, note.kind) == ("[seqcls] seqcls: release refused at preflight", "warning")
    assert note.body.startswith("bad release input: model name 'x..y' is not allowed")
    # a checkpoint outside the model's root (here: $SEQCLS_HOME/checkpoints), and a conf choosing the root
    dag = parse_dag(monkeypatch, SEQCLS_PADDLE_PYTHON=None)  # one process: dag.test() leaves conf values in dag.params
    root = (home / "checkpoints").resolve()
    for conf, expected in (
        (
            {"checkpoint": str(tiny_checkpoint)},
            f"bad release input: checkpoint {str(tiny_checkpoint)!r} resolves to {tiny_checkpoint.resolve()}, "
            f"which is outside this model's checkpoints root {root}",
        ),
        (
            {"checkpoint": "latest", "checkpoints_root": str(tiny_checkpoint.parent)},
            f"bad release input: checkpoints_root {str(tiny_checkpoint.parent)!r} is not a run param",
        ),
    ):
        dr, states = run_dag(dag, conf)
        assert dr.state == "failed" and states["resolve_checkpoint"] == "failed", states
        assert expected in "".join(capfd.readouterr()), expected
    assert not (home / "releases").exists()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("arch", "architecture", "inputs"),
    [
        ("deberta-v2", "DebertaV2ForSequenceClassification", "['input_ids', 'attention_mask']"),
        ("bert", "BertForSequenceClassification", "['input_ids', 'token_type_ids', 'attention_mask']"),
    ],
)
def test_a_transformers_checkpoint_releases_through_the_same_dag(
    airflow_db: Path,
    triton,
    hf_checkpoints_src: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    arch: str,
    architecture: str,
    inputs: str,
) -> None:
    """Issue 15: Hugging Face DeBERTa-v2 and BERT go through the unchanged DAG and contract — no
    framework param; the task logs say what was detected and exported."""
    from seqcls.contract.names import MODELS

    root = tmp_path / "checkpoints"
    shutil.copytree(hf_checkpoints_src[arch], root / f"{arch}-run")
    monkeypatch.setenv("SEQCLS_CHECKPOINTS_ROOT", str(root))
    dag = parse_dag(monkeypatch, SEQCLS_PADDLE_PYTHON=None)
    assert "framework" not in dag.params  # detected from the checkpoint, never asked for
    dr, states = run_dag(dag, {"checkpoint": "latest"})
    assert dr.state == "success", states
    assert states == {**{t: "success" for t in TASKS}, "rollback": "skipped", REPORT_TASK: "success"}
    assert ready_models(triton) == {m: ["1"] for m in MODELS}
    champion = champion_version()
    assert champion is not None and champion.tags["framework"] == "transformers"
    text = "".join(capfd.readouterr())
    for line in (
        f"(transformers {architecture})",
        f"takes {inputs}",
        "tokenizer parity (transformers BertTokenizer (vocab.txt) vs serving tokenizer.json) passed",
        "smoke: ok in",
    ):
        assert line in text, f"task logs lack {line!r}"


# ----------------------------------------------------------------------------- airflow tasks test


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_tasks_test_script_runs_every_task(airflow_db: Path, triton, tiny_checkpoint: Path, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "airflow-tasks-test.py"),
        "--checkpoint",
        str(tiny_checkpoint),
        "--logs",
        str(tmp_path / "logs"),
        "--task-timeout",
        "300",
    ]
    t0 = time.perf_counter()
    env = {**os.environ, "SEQCLS_CHECKPOINTS_ROOT": str(tiny_checkpoint.parent)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=560, env=env)
    print(f"\n{out.stdout}{out.stderr[-3000:]}\ntasks-test script: {time.perf_counter() - t0:.0f}s")
    assert out.returncode == 0
    for task_id in TASKS:
        assert f"✓ {task_id} " in out.stdout
    assert "✓ rollback skipped" in out.stdout
    assert ready_models(triton)["seqcls"] == ["1"]
    assert int(champion_version().version) == 1


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_tasks_test_script_stops_at_the_first_failure(
    airflow_db: Path, triton, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """`tasks test` exits 0 on a failed task: the script must notice (here: export) and stop. (Triton up:
    resolve's preflight checks it.)"""
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    config["num_hidden_layers"] += 1  # the weights lack a layer: cheap checks pass, export refuses
    (tiny_checkpoint / "config.json").write_text(json.dumps(config))
    cmd = [sys.executable, str(ROOT / "scripts" / "airflow-tasks-test.py"), "--checkpoint", str(tiny_checkpoint)]
    env = {**os.environ, "SEQCLS_CHECKPOINTS_ROOT": str(tiny_checkpoint.parent)}
    out = subprocess.run([*cmd, "--logs", str(tmp_path / "logs")], capture_output=True, text=True, timeout=280, env=env)
    assert out.returncode == 1, out.stdout + out.stderr[-2000:]
    assert "✓ resolve_checkpoint success" in out.stdout and "convert_onnx" not in out.stdout + out.stderr
    assert "✗ export_static" in out.stderr and "manifest: export failed — CheckpointError" in out.stderr
    assert str(tmp_path / "logs" / "01-export_static.log") in out.stderr


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_preflight_at_resolve_names_the_label_and_the_connection(
    airflow_db: Path, tiny_checkpoint: Path, home: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    """Issue 25: a typo'd threshold label, and a stopped Triton, fail resolve_checkpoint in seconds — naming
    the label (with the closest one) and the Connection to fix — before export runs."""
    from seqcls.localtriton import free_ports

    (home / "checkpoints").mkdir(parents=True)
    ckpt = shutil.copytree(tiny_checkpoint, home / "checkpoints" / "tiny")
    label = (ckpt / "label.txt").read_text(encoding="utf-8").split()[0]
    dag = parse_dag(monkeypatch, SEQCLS_PADDLE_PYTHON=None)
    conf = {"checkpoint": str(ckpt), "skip_if_champion": False, "thresholds": {label + "x": 0.6}}
    dr, states = run_dag(dag, conf)
    assert dr.state == "failed" and states["resolve_checkpoint"] == "failed", states
    logs = "".join(capfd.readouterr())
    assert f"bad release input: thresholds: {label + 'x'!r} (did you mean {label!r}?) is not a label" in logs
    (port,) = free_ports(1)
    dag = parse_dag(monkeypatch, SEQCLS_PADDLE_PYTHON=None, SEQCLS_TRITON_GRPC=f"127.0.0.1:{port}")
    dr, states = run_dag(dag, {"checkpoint": str(ckpt)})
    assert dr.state == "failed" and states["resolve_checkpoint"] == "failed", states
    logs = "".join(capfd.readouterr())
    assert f"Triton is not answering at 127.0.0.1:{port}" in logs
    assert "check the Airflow Connection 'triton_default'" in logs
    manifests = list((home / "releases").glob("*/*/manifest.json"))
    assert manifests and all("export" not in json.loads(m.read_text()).get("steps", {}) for m in manifests)
