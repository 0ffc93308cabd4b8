"""Release-outcome notifications (issue 25): what an outcome says, where the URLs come from and how they are
checked, that a secret in an URL is never shown, and delivery through Apprise to real receivers on
loopback — an HTTP endpoint taking ``json://`` posts and an aiosmtpd server taking ``mailto://`` mail —
from the library, the real CLI, and the release DAG's ``report_outcome`` task.

(The DAG *runs* that notify are tests/test_airflow_dag.py's: they already run a release, a skip, a smoke
failure with rollback and a refusal; their receiver asserts ride along on those runs.)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from seqcls.errors import InputError
from seqcls.notify import FAILED, PROMOTED, REFUSED, ROLLED_BACK, SKIPPED, Outcome, classify, release_facts, render
from seqcls.notify.delivery import check_urls, masked, send, split_urls, url_secrets
from seqcls.notify.outcome import UNDONE
from tests.helpers.airflow import DAGS, private_airflow_home
from tests.helpers.checkpoints import minimal_checkpoint
from tests.helpers.receivers import json_receiver, smtp_receiver, wait_for

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow
__all__ = ["json_receiver", "smtp_receiver"]  # the fixtures, imported for this module's tests

SECRET = "s3cretPW-do-not-show"


def promoted() -> Outcome:
    return Outcome(
        "alpha", PROMOTED, triton_version=5, mlflow_version=4, previous=4, previous_mlflow=3,
        fingerprint="1a2b3c4d5e6f7a8b9c", checkpoint="/data/alpha/run-7",
        gates={"parity": "passed", "quality": "passed"}, user="ops", host="worker-1", via="seqcls release",
    )  # fmt: skip


def refused() -> Outcome:
    return Outcome(
        "alpha", REFUSED, step="evaluate_quality", gate="quality",
        reason="quality gate refused: macro-F1 0.61 is 0.08 below the champion's 0.69 (max drop 0.02)",
        fingerprint="ffee00112233", serving=4, serving_mlflow=3, gates={"parity": "passed", "quality": "refused"},
    )  # fmt: skip


# ----------------------------------------------------------------------------- the outcome and its message


@pytest.mark.parametrize(
    ("step", "error", "promoted_", "expected"),
    [
        (None, "", True, (PROMOTED, None)),
        (None, "", False, (SKIPPED, None)),
        ("resolve", "AirflowFailException", False, (REFUSED, "preflight")),
        ("validate", "GateError", False, (REFUSED, "parity")),
        ("evaluate", "GateError", False, (REFUSED, "quality")),
        ("validate", "RuntimeError", False, (FAILED, None)),  # the gate broke: not a verdict
        ("approval", "", False, (REFUSED, "approval")),
        ("evaluate", "InputError", False, (REFUSED, None)),
        ("smoke", "SmokeError", False, (FAILED, None)),
    ],
)
def test_refused_is_a_verdict_failed_is_a_breakage(step, error, promoted_, expected) -> None:
    assert classify(step, error, promoted=promoted_) == expected


def test_messages_say_what_happened_to_which_model_reason_first() -> None:
    title, body = render(promoted())
    assert title == "[seqcls] alpha: Triton v5 (MLflow v4) promoted"
    lines = body.splitlines()
    assert lines[0] == "alpha serves Triton v5 (MLflow v4); MLflow champion → v4; before: Triton v4 (MLflow v3)."
    assert "release: Triton v5 (MLflow v4), fingerprint 1a2b3c4d5e6f, checkpoint /data/alpha/run-7" in lines
    assert "gates: parity passed, quality passed" in lines and "by: ops@worker-1 via seqcls release" in lines

    title, body = render(refused())
    assert title == "[seqcls] alpha: release refused by the quality gate"
    assert body.splitlines()[0].startswith("quality gate refused: macro-F1 0.61")  # the reason first
    assert "serving now: Triton v4 (MLflow v3)" in body and "stopped at: evaluate_quality" in body

    failed = Outcome("alpha", FAILED, reason="smoke test of alpha Triton v6 failed", step="smoke_test", rollback=UNDONE,
                     triton_version=6, serving=5)  # fmt: skip
    title, body = render(failed)
    assert title == "[seqcls] alpha: release failed at smoke_test; candidate withdrawn"
    assert "rollback: this attempt was undone" in body and "serving now: Triton v5" in body
    title, _ = render(Outcome("alpha", FAILED, reason="MLflow down", step="register_model", rollback=UNDONE))
    assert title == "[seqcls] alpha: release failed at register_model; its registry changes undone"
    title, body = render(Outcome("alpha", ROLLED_BACK, serving=4, serving_mlflow=3, previous=5, previous_mlflow=4))
    assert title == "[seqcls] alpha: rolled back to Triton v4 (MLflow v3)"
    assert body.splitlines()[0] == "alpha serves Triton v4 (MLflow v3) again (was Triton v5 (MLflow v4))."
    title, body = render(Outcome("alpha", ROLLED_BACK, serving=4, previous=4, triton_version=5))  # in flight
    assert title == "[seqcls] alpha: candidate Triton v5 withdrawn"
    assert body.splitlines()[0] == "alpha's candidate Triton v5 was withdrawn; Triton v4 still serves."
    title, _ = render(
        Outcome("alpha", REFUSED, reason="bad release input: …", step="resolve_checkpoint", gate="preflight")
    )
    assert title == "[seqcls] alpha: release refused at preflight"
    with pytest.raises(ValueError, match="outcome kind"):
        Outcome("alpha", "exploded")


def _record(status: str, at: str, **fields) -> dict:
    return {"status": status, "finished_at": at, **fields}


def test_release_facts_come_from_the_workspace_records() -> None:
    """Versions, gate verdicts, the failed step and the rollback, from a manifest as the steps write it;
    a failure recorded before the attempt started is an earlier attempt's."""
    t0, t1 = "2026-01-01T10:00:00+00:00", "2026-01-01T11:00:00+00:00"
    manifest = {
        "fingerprint": "ab" * 32,
        "checkpoint": {"source": "/data/alpha/run-7", "path": "/home/x/checkpoint"},
        "steps": {
            "validate": _record("ok", t1),
            "evaluate": _record("ok", t1),
            "register": _record("ok", t1, summary={"version": 4}),
            "publish": _record("ok", t1, summary={"version": 6}),
            "smoke": _record("failed", t1, error="SmokeError: smoke test of alpha Triton v6 failed: 3 of 65 differ"),
            "expose": _record("failed", t0, error="ServingError: an older attempt's"),
            "rollback": _record("ok", t1, summary={"rolled_back": True, "serving_version": 5}),
        },
    }
    facts = release_facts(manifest, since=t1)
    assert (facts.triton_version, facts.mlflow_version, facts.checkpoint) == (6, 4, "/data/alpha/run-7")
    assert facts.gates == {"parity": "passed", "quality": "passed"}
    assert (facts.failed_step, facts.undone) == ("smoke", True)
    assert facts.error.startswith("SmokeError: smoke test of alpha Triton v6 failed")
    manifest["steps"]["evaluate"] = _record("failed", t1, error="GateError: quality gate refused: …")
    facts = release_facts(manifest, reached=("export", "convert", "validate", "evaluate"), since=t1)
    assert facts.gates == {"parity": "passed", "quality": "refused"} and facts.failed_step == "evaluate"
    assert facts.triton_version is None and facts.mlflow_version is None  # not reached in this attempt
    override = {"gate": "quality", "by": "alice@ops", "reason": "retired labels (OPS-42)", "verdict": "refused: …"}
    manifest["steps"]["evaluate"] = _record(
        "ok", t1, summary={"passed": False, "overridden": True, "override": override}
    )
    facts = release_facts(manifest, since=t1)
    assert facts.gates["quality"] == "OVERRIDDEN by alice@ops: retired labels (OPS-42)"  # loud in the message
    _, body = render(Outcome("alpha", PROMOTED, triton_version=6, gates=facts.gates))
    assert "gates: parity passed, quality OVERRIDDEN by alice@ops: retired labels (OPS-42)" in body


# ----------------------------------------------------------------------------- URLs: checked, masked


def test_urls_are_a_list_or_one_string_and_each_must_be_an_apprise_url() -> None:
    one, two = "json://127.0.0.1:9/a", f"mailto://ops:{SECRET}@example.com"
    assert split_urls(f" {one}  {two} ") == (one, two) == check_urls([one, two], "here")
    assert check_urls(f"{one} {two}", "here") == (one, two) and check_urls(None, "x") == check_urls([], "x") == ()
    for bad in (f"slack://{SECRET}", f"http://u:{SECRET}@example.com", "nonsense"):
        with pytest.raises(InputError) as caught:
            check_urls([one, bad], "models.yaml: model 'alpha': notify")
        message = str(caught.value)
        assert (
            message.startswith("models.yaml: model 'alpha': notify: URL 2 of 2 (") and "not an Apprise URL" in message
        )
        assert SECRET not in message and "nonsense" not in message
    with pytest.raises(InputError, match=r"notify: expected Apprise URLs .* got int/str"):
        check_urls([one, 5], "notify")


def test_an_url_is_only_ever_shown_masked_and_its_secrets_are_named() -> None:
    url = f"json://bob:{SECRET}@hooks.example.com:8443/seqcls?+X-Token={SECRET}x"
    shown = masked(url)
    assert shown.startswith("json://bob:****@hooks.example.com:8443/seqcls") and SECRET not in shown
    assert SECRET in url_secrets(url) and url in url_secrets(url)
    slack = "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ/#general"
    assert "TIiajkdnlazkcOXrIdevi7FQ" not in masked(slack) and "TIiajkdnlazkcOXrIdevi7FQ" in url_secrets(slack)


# ----------------------------------------------------------------------------- delivery to real receivers


def test_promoted_and_refused_reach_a_json_endpoint_and_an_smtp_server(json_receiver, smtp_receiver) -> None:
    targets = [json_receiver.url(auth=f"bob:{SECRET}"), smtp_receiver.url()]
    for outcome in (promoted(), refused()):
        result = send(targets, outcome)
        assert result.ok and len(result.sent) == 2, result.line()
        assert all(SECRET not in s for s in result.sent)
    posts, mails = wait_for(json_receiver, 2), wait_for(smtp_receiver, 2)
    for got, outcome in zip(posts, (promoted(), refused()), strict=True):
        assert (got.title, got.body) == render(outcome)
        assert got.path == "/hooks/seqcls" and got.headers["Authorization"].startswith("Basic ")  # the secret went
    assert [p.kind for p in posts] == ["success", "warning"]
    for got, outcome in zip(mails, (promoted(), refused()), strict=True):
        assert (got.title, got.body) == render(outcome)


def test_a_failing_service_is_a_warning_never_an_error(json_receiver, caplog: pytest.LogCaptureFixture) -> None:
    json_receiver.status = 500
    dead = f"json://bob:{SECRET}@127.0.0.1:9/nobody"  # port 9 (discard): nothing listens
    with caplog.at_level(logging.DEBUG):
        result = send([json_receiver.url(), dead], refused(), timeout=10)
    assert not result.ok and result.sent == [] and len(result.failed) == 2
    assert "json://bob:****@127.0.0.1:9/nobody (failure)" in result.failed
    assert "not delivered" in caplog.text and SECRET not in caplog.text  # Apprise's own debug lines too
    assert len(wait_for(json_receiver, 1)) == 1


# ----------------------------------------------------------------------------- the CLI


def test_cli_release_refused_at_preflight_is_sent(
    home: Path, tmp_path: Path, json_receiver, smtp_receiver, monkeypatch, capsys, caplog
) -> None:
    """`seqcls release` of a checkpoint that cannot be released: exit code and output as without notifying,
    then the refusal at both receivers, with the command's own reason."""
    from seqcls.cli import main

    ckpt = minimal_checkpoint(tmp_path / "ckpt")
    (ckpt / "label.txt").unlink()
    urls = f"{json_receiver.url(auth=f'bob:{SECRET}')} bogus://x {smtp_receiver.url()}"
    monkeypatch.setenv("SEQCLS_NOTIFY_URLS", urls)
    code = main(["release", "--checkpoint", str(ckpt), "--model-name", "alpha"])
    err = capsys.readouterr().err
    assert code != 0 and "error: " in err and SECRET not in err + caplog.text
    assert "SEQCLS_NOTIFY_URLS: URL 2 of 3 (bogus://…) is not an Apprise URL" in caplog.text  # a warning; the rest told
    (post,), (mail,) = wait_for(json_receiver, 1), wait_for(smtp_receiver, 1)
    assert post.title == mail.title == "[seqcls] alpha: release refused at preflight"
    reason = err.split("error: ", 1)[1].strip().splitlines()[0]
    assert post.body.splitlines()[0] == reason and "label" in reason  # what the CLI printed, first
    assert "by: " in post.body and "via seqcls release" in post.body and post.kind == "warning"


def test_cli_without_urls_or_for_other_commands_sends_nothing(home: Path, json_receiver, monkeypatch) -> None:
    from seqcls.cli import main

    assert main(["lease", "break", "--model-name", "alpha"]) == 0  # not release/rollback: nothing to tell
    monkeypatch.setenv("SEQCLS_NOTIFY_URLS", json_receiver.url())
    assert main(["lease", "break", "--model-name", "alpha"]) == 0
    assert wait_for(json_receiver, 1, timeout=0.5) == []


# ----------------------------------------------------------------------------- the models file and the DAG


def _models(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_models_file_notify_per_model_with_defaults_and_opt_out(tmp_path: Path) -> None:
    from seqcls.airflow.models_file import load_models

    one, two = (
        f"json://bob:{SECRET}@127.0.0.1:9/a",
        "mailto://127.0.0.1:2525?mode=insecure&from=seqcls@example.com&to=ops@example.com",
    )
    path = _models(
        tmp_path,
        f"defaults: {{notify: '{one} {two}'}}\n"
        "models:\n  - name: alpha\n  - name: beta\n    notify: []\n"
        f"  - name: gamma\n    notify: ['{two}']\n    notify_conn_id: apprise_ops\n",
    )
    alpha, beta, gamma = load_models(path)
    assert (alpha.notify, beta.notify, gamma.notify) == ((one, two), (), (two,))
    assert gamma.notify_conn_id == "apprise_ops" and alpha.notify_conn_id is None
    assert SECRET not in repr(alpha) and "notify" not in alpha.params  # not a run param: not in the form
    bad = _models(tmp_path, f"models:\n  - name: alpha\n    notify: ['{one}', 'https://u:{SECRET}@example.com/x']\n")
    with pytest.raises(InputError) as caught:
        load_models(bad)
    assert str(caught.value).startswith(f"{bad}: model 'alpha': notify: URL 2 of 2 (https://…) is not an Apprise URL")
    assert SECRET not in str(caught.value)
    bad = _models(tmp_path, "models:\n  - name: alpha\n    notify_conn_id: ''\n")
    with pytest.raises(InputError, match="model 'alpha': notify_conn_id: must be a Connection id"):
        load_models(bad)


def test_report_task_is_a_teardown_after_every_task_and_keeps_urls_out_of_the_dag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    from seqcls.airflow.outcome import REPORT_TASK

    url = f"json://bob:{SECRET}@127.0.0.1:9/hook"
    path = _models(tmp_path, f"models:\n  - name: alpha\n    approval: required\n    notify: ['{url}']\n")
    for var in ("SEQCLS_SCHEDULE", "SEQCLS_MODEL_NAME", "SEQCLS_PADDLE_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SEQCLS_MODELS_FILE", str(path))
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}, bag.import_errors
    dag = bag.dags["seqcls_release__alpha"]
    report = dag.get_task(REPORT_TASK)
    assert report.is_teardown and not report.on_failure_fail_dagrun  # never decides the run's state
    assert report.upstream_task_ids == set(dag.task_ids) - {REPORT_TASK} and not report.downstream_task_ids
    assert "notifies 1 Apprise target(s)" in dag.doc_md and SECRET not in dag.doc_md
    assert SECRET not in json.dumps(DagSerialization.to_dict(dag), default=str)  # the UI and the DB never see it


def test_the_run_outcome_follows_the_task_states() -> None:
    from seqcls.airflow.outcome import STOPS, run_outcome

    ok = {t: "success" for t in STOPS if t != "approve_release"}
    assert run_outcome("m", {**ok, "rollback": "skipped"}, {}).kind == PROMOTED
    assert run_outcome("m", {t: "skipped" for t in ok}, {}) is None  # resolve skipped: already champion
    states = {**ok, "smoke_test": "failed", "expose_version": "upstream_failed", "promote": "upstream_failed"}
    o = run_outcome("m", {**states, "rollback": "success"}, {"smoke_test": "SmokeError: version 2 answers differ"})
    assert (o.kind, o.step, o.rollback, o.reason) == (FAILED, "smoke_test", UNDONE, "version 2 answers differ")
    states = {"resolve_checkpoint": "success", "export_static": "success", "convert_onnx": "success",
              "validate_parity": "failed", "rollback": "skipped"}  # fmt: skip
    facts = release_facts({"steps": {"validate": _record("failed", "t", error="GateError: tokenizer ids differ")}})
    o = run_outcome("m", states, {}, facts)  # an external-python task pushes nothing: the workspace says why
    assert (o.kind, o.gate, o.reason, o.rollback) == (REFUSED, "parity", "tokenizer ids differ", "")
    o = run_outcome("m", {**ok, "approve_release": "failed", "rollback": "success"}, {})
    assert (o.kind, o.gate, o.step) == (REFUSED, "approval", "approve_release")


def test_urls_and_an_apprise_connection_are_masked_then_sent_through(json_receiver, monkeypatch) -> None:
    """The task's targets: the models file's URLs and the services of an `apprise` Connection (read by the
    provider's AppriseHook from AIRFLOW_CONN_*), every secret part registered with Airflow's masker first."""
    from airflow.sdk._shared.secrets_masker import redact  # what airflow.sdk.log.mask_secret feeds

    from seqcls.airflow.outcome import notify_targets

    token = "conn-token-0123456789"
    config = {"path": json_receiver.url(path="from-connection", auth=f"ops:{token}"), "tag": "alerts"}
    monkeypatch.setenv("AIRFLOW_CONN_APPRISE_OPS", json.dumps({"conn_type": "apprise", "extra": {"config": config}}))
    url = json_receiver.url(path="from-models-file", auth=f"bob:{SECRET}")
    targets = notify_targets([url], "apprise_ops")
    for secret in (SECRET, token, url):
        assert redact(f"x {secret} y") == "x *** y", secret
    assert send(targets, refused()).ok
    assert sorted(p.path for p in wait_for(json_receiver, 2)) == ["/from-connection", "/from-models-file"]
    assert notify_targets([], "no_such_connection") == []  # a warning: the run's outcome is still reported


def test_cli_outcome_of_a_release_that_stopped_in_a_step(home: Path, tmp_path: Path) -> None:
    """What `seqcls release` left — the exception, and the workspace of its checkpoint written since it
    started — decides refused-by-a-gate versus failed-and-withdrawn (no Paddle: the records are written here)."""
    import argparse

    from seqcls.errors import GateError, SmokeError
    from seqcls.notify.commands import Watch

    ckpt = tmp_path / "run-7"
    ckpt.mkdir()
    args = argparse.Namespace(command="release", checkpoint=str(ckpt), model_name="alpha", home=None, until=None)
    watch = Watch.start(args, ("json://127.0.0.1:9/x",))
    ws = watch.settings.releases_dir / "alpha" / ("cd" * 8)
    ws.mkdir(parents=True)
    later = "9999-01-01T00:00:00+00:00"  # after the command started (an older workspace is not this command's)

    def leave(steps: dict) -> None:
        manifest = {"fingerprint": "cd" * 32, "checkpoint": {"source": str(ckpt)}, "steps": steps, "updated_at": later}
        (ws / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")

    leave({"validate": _record("failed", later, error="GateError: parity gate refused: tokenizer ids differ on 3")})
    o = watch.release(GateError("parity gate refused: tokenizer ids differ on 3"), 1, "")
    assert (o.kind, o.gate, o.step, o.reason) == (
        REFUSED,
        "parity",
        "validate",
        "parity gate refused: tokenizer ids differ on 3",
    )
    assert o.fingerprint == "cd" * 6 and o.checkpoint == str(ckpt) and o.gates == {"parity": "refused"}
    leave({
        "validate": _record("ok", later), "evaluate": _record("ok", later),
        "publish": _record("ok", later, summary={"version": 3}),
        "smoke": _record("failed", later, error="SmokeError: smoke test of alpha Triton v3 failed: 2 differ"),
        "rollback": _record("ok", later, summary={"rolled_back": True}),
    })  # fmt: skip
    o = watch.release(SmokeError("smoke test of alpha Triton v3 failed: 2 differ"), 1, "")
    assert (o.kind, o.step, o.rollback, o.triton_version) == (FAILED, "smoke", UNDONE, 3)
    assert render(o)[0] == "[seqcls] alpha: release failed at smoke; candidate withdrawn"
    (ws / "manifest.json").write_text(json.dumps({"updated_at": "2000-01-01T00:00:00+00:00"}), encoding="utf-8")
    o = watch.release(None, 2, "thresholds: 'nope' is not a label")  # preflight printed it, exit 2
    assert (o.kind, o.gate, o.reason, o.fingerprint) == (
        REFUSED,
        "preflight",
        "thresholds: 'nope' is not a label",
        None,
    )
    watch.until = "validate"
    assert watch.release(None, 0, "") is None  # stopped where asked: nothing released, nothing to tell
