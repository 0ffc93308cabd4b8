"""The optional human approval (issue 24): models file ``approval: required`` → Airflow's ApprovalOperator
between ``smoke_test`` and ``expose_version``, showing the quality gate's numbers and the smoke result.

- fast: the models-file key (values, defaults, errors naming the file, model and key), the DAG shape
  (the task only when required, between smoke and expose, rollback downstream of it), the text shown;
- slow: one real Airflow stack (api-server, scheduler, dag-processor, triggerer; LocalExecutor, sqlite
  seeded from the session's migrated database) for the module, a real local Triton, MLflow on sqlite.
  A first release is approved over REST (``PATCH .../hitlDetails``) and goes live; a second checkpoint
  is rejected: the run fails, rollback withdraws the candidate, the served version and the MLflow
  champion are unchanged and ``seqcls status`` agrees. The heavy steps (export, convert, validate) of
  both checkpoints are done in this process while the stack starts: the DAG's tasks find them done.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from tests.helpers.airflow import airflow_db, private_airflow_home, seed_migrated_db

AIRFLOW_HOME = private_airflow_home()  # before anything imports airflow
__all__ = ["airflow_db"]  # the session's migrated Airflow database, the fixture imported for this module

MODEL = ModelName("gated")
DAG_ID = f"seqcls_release__{MODEL}"
APPROVE_TASK = "approve_release"
#: The quality rules that compare with the champion, off (a drop of at most 1 always passes): two random tiny
#: checkpoints differ arbitrarily, and the subject here is the human decision after a passed gate, not the gate.
#: Loosening a rule is an override of its gate, given with its reason.
RULES_OFF = {
    "max_f1_drop": 1.0,
    "max_level_f1_drop": 1.0,
    "max_label_f1_drop": 1.0,
    "override": "quality",
    "override_reason": "two random tiny checkpoints: the subject is the approval, not the gate",
}
#: The drop rules back at their defaults, and no override of the quality gate (a DAG run's conf).
RULES_DEFAULT = {
    "max_f1_drop": 0.025,
    "max_level_f1_drop": 0.03,
    "max_label_f1_drop": 0.15,
    "override": "parity",
    "override_reason": "a run that means the quality gate to judge",
}


def _models_file(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- fast: the key, the DAG, the text


def test_the_approval_key_of_the_models_file(tmp_path: Path) -> None:
    from seqcls.airflow.models_file import load_models
    from seqcls.errors import InputError

    path = _models_file(
        tmp_path / "models.yaml",
        """
        defaults: {approval: required}
        models:
          - name: alpha
          - name: beta
            approval: none
        """,
    )
    alpha, beta = load_models(path)
    assert (alpha.approval, alpha.approval_required, beta.approval, beta.approval_required) == (
        "required",
        True,
        "none",
        False,
    )
    (plain,) = load_models(_models_file(tmp_path / "plain.yaml", "models: [{name: alpha}]\n"))
    assert plain.approval == "none" and not plain.approval_required  # the default: today's DAG
    for value in ("yes", "Required", "true", "[required]"):  # YAML's yes/true are booleans: refused too
        bad = _models_file(tmp_path / "bad.yaml", f"models: [{{name: alpha, approval: {value}}}]\n")
        with pytest.raises(InputError, match=r"model 'alpha': approval: expected none or required") as info:
            load_models(bad)
        assert str(info.value).startswith(str(bad)), info.value
    bad = _models_file(tmp_path / "bad.yaml", "defaults: {approval: maybe}\nmodels: [{name: alpha}]\n")
    with pytest.raises(InputError, match=r"model 'alpha': approval: .* got 'maybe'"):
        load_models(bad)


def test_the_approval_task_sits_between_smoke_and_expose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    from seqcls.airflow.context import ROLLBACK_ON, ROLLBACK_TASK, TASK_ORDER
    from seqcls.airflow.outcome import REPORT_TASK

    path = _models_file(
        tmp_path / "models.yaml", f"models: [{{name: seqcls}}, {{name: {MODEL}, approval: required}}]\n"
    )
    for var in ("SEQCLS_SCHEDULE", "SEQCLS_MODEL_NAME", "SEQCLS_PADDLE_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SEQCLS_MODELS_FILE", str(path))
    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[1] / "dags"))
    assert bag.import_errors == {}, bag.import_errors
    plain, gated = bag.dags["seqcls_release"], bag.dags[DAG_ID]
    assert set(plain.task_ids) == {*TASK_ORDER, REPORT_TASK}  # without approval: exactly today's tasks
    assert plain.get_task(ROLLBACK_TASK).upstream_task_ids == set(ROLLBACK_ON)
    assert set(gated.task_ids) == {*TASK_ORDER, APPROVE_TASK, REPORT_TASK}
    approve = gated.get_task(APPROVE_TASK)
    assert isinstance(approve, ApprovalOperator) and approve.fail_on_reject, type(approve)
    assert approve.upstream_task_ids == {"smoke_test"}
    assert approve.downstream_task_ids == {"expose_version", ROLLBACK_TASK, REPORT_TASK}
    assert gated.get_task("expose_version").upstream_task_ids == {APPROVE_TASK}
    assert gated.get_task(ROLLBACK_TASK).upstream_task_ids == {*ROLLBACK_ON, APPROVE_TASK}
    assert approve.response_timeout is not None  # an unanswered release does not hold the model for ever
    assert "approve_release" in gated.doc_md and "approve_release" not in plain.doc_md.split("\n\n")[1]


def test_the_text_says_when_the_gate_did_not_run() -> None:
    from seqcls.airflow.tasks import approval_text

    why = "no eval set: none configured — the quality gate did not run"
    summary = {
        "model_name": MODEL,
        "fingerprint": "ab" * 32,
        "checkpoint": "/ckpt/run-1",
        "workspace": "/ws",
        "version": 3,
        "quality": {
            "passed": True,
            "verdict": f"skipped — {why}",
            "candidate": None,
            "champion": None,
            "champion_version": 2,
            "eval_set": None,
            "failures": [],
            "skipped": [why],
            "champion_disagreements": None,
            "bad_cases": None,
        },
        "smoke": {"message": "65 golden texts answered as validated", "route": f"{MODEL}_candidate"},
    }
    subject, body = approval_text(summary)
    assert subject == f"Release {MODEL} (Triton v3, fingerprint {'ab' * 6})? Quality gate did not run"
    assert f"### Quality gate — skipped — {why}" in body and "micro-F1" not in body
    assert "### Smoke test — 65 golden texts answered as validated" in body


# ----------------------------------------------------------------------------- slow: a real stack, over REST


@dataclass
class Stack:
    """The module's Airflow stack and what its runs release."""

    airflow: object  # seqcls_tools.demo.stack.AirflowStack
    settings: object  # seqcls.settings.Settings of the stack's home, Triton and MLflow
    token: str
    workspaces: dict[str, Path]  # checkpoint directory name → its release workspace

    def rest(self, method: str, path: str, body: dict | None = None):
        import requests

        headers = {"Authorization": f"Bearer {self.token}"}
        resp = requests.request(method, self.airflow.url + path, json=body, headers=headers, timeout=30)
        assert resp.ok, f"{method} {path}: {resp.status_code} {resp.text[:2000]}"
        return resp.json()

    def wait(self, what: str, check, timeout: float):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = {n: p.returncode for n, p in self.airflow.procs.items() if p.poll() is not None}
            assert not dead, f"airflow components exited {dead} while waiting for {what}\n{self.log_tail()}"
            try:
                if value := check():
                    return value
            except AssertionError:
                pass
            time.sleep(1.0)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        out = []
        for name in self.airflow.procs:
            path = self.airflow.logs / f"{name}.log"
            lines = path.read_text(errors="replace").splitlines()[-n:] if path.exists() else []
            out.append(f"--- {name} ---\n" + "\n".join(line[:300] for line in lines))
        return "\n".join(out)

    def states(self, run_id: str) -> dict[str, str]:
        tis = self.rest("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: t["state"] for t in tis}

    def release_until_approval(self, checkpoint: str) -> tuple[str, dict]:
        """Trigger a run of ``checkpoint``; wait for its approval task to ask; its hitlDetails."""
        run_id = self.rest(
            "POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"checkpoint": checkpoint}}
        )["dag_run_id"]

        def asking() -> bool:
            states = self.states(run_id)
            assert "failed" not in states.values() and "upstream_failed" not in states.values(), states
            return states.get(APPROVE_TASK) == "awaiting_input"

        self.wait(f"{APPROVE_TASK} of {checkpoint} to ask", asking, 300)
        # Airflow 3.3 race: an answer that reaches the scheduler before it has processed the executor's
        # report of the paused workload gets the resumed task marked FAILED ("finished with state
        # success, but the task instance's state attribute is queued"). A person never answers within
        # that second; the test waits for the scheduler to have taken the report first.
        scheduler_log = self.airflow.logs / "scheduler.log"

        def reported() -> bool:
            text = scheduler_log.read_text(errors="replace") if scheduler_log.exists() else ""
            return any(
                "Received executor event" in line and f"task_id='{APPROVE_TASK}'" in line and run_id in line
                for line in text.splitlines()
            )

        self.wait(f"the scheduler to take {APPROVE_TASK}'s pause of {checkpoint}", reported, 60)
        return run_id, self.rest("GET", self.hitl(run_id))

    def hitl(self, run_id: str) -> str:
        return f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{APPROVE_TASK}/-1/hitlDetails"

    def answer(self, run_id: str, option: str) -> tuple[str, dict[str, str]]:
        """Approve or Reject over REST; the run's final state and task states."""
        answered = self.rest("PATCH", self.hitl(run_id), {"chosen_options": [option]})
        assert answered["chosen_options"] == [option], answered

        def finished() -> str | None:
            state = self.rest("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
            return state if state in ("success", "failed") else None

        return self.wait(f"run {run_id} to finish", finished, 180), self.states(run_id)

    def status(self):
        from seqcls.ops.status import model_status

        return model_status(self.settings, MODEL)


def _eval_set(path: Path) -> Path:
    from seqcls_tools.testing import TINY_CORPUS, TINY_LABELS

    leaves = [label for label in TINY_LABELS if "##" in label]
    rows = [
        {"text": t, "labels": [leaves[i % len(leaves)].split("##")[0], leaves[i % len(leaves)]]}
        for i, t in enumerate(TINY_CORPUS * 6)  # 60 texts: at least the 50 a quality verdict is taken on
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def stack(
    airflow_db: Path, tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path, tmp_path_factory: pytest.TempPathFactory
):
    from seqcls.config import ReleaseConfig
    from seqcls.localtriton import free_ports
    from seqcls.release.intake import open_release
    from seqcls.steps import run_release
    from seqcls_tools.demo.stack import AirflowStack
    from tests.helpers.triton import settings_for, start_triton

    t0 = time.perf_counter()
    root = tmp_path_factory.mktemp("approval")
    triton = start_triton(root)
    settings = settings_for(triton, root / "home")
    model_root = Path(str(settings.checkpoints_root)) / MODEL
    model_root.mkdir(parents=True)
    for name, src in (("run-a", tiny_checkpoint_src), ("run-b", tiny_checkpoint_b_src)):
        shutil.copytree(src, model_root / name)
    eval_set = _eval_set(model_root / "eval.jsonl")
    params = {"eval_set": eval_set.name, **RULES_OFF}
    models = _models_file(
        root / "models.yaml", json.dumps({"models": [{"name": MODEL, "approval": "required", "params": params}]})
    )
    port, worker_log, trigger_log = free_ports(3)
    airflow = AirflowStack(root / "stack", settings, port=port, log_ports=(worker_log, trigger_log))
    airflow.env.update(SEQCLS_MODELS_FILE=str(models))
    for var in ("SEQCLS_SCHEDULE", "SEQCLS_MODEL_NAME", "SEQCLS_PADDLE_PYTHON"):
        airflow.env.pop(var, None)
    seed_migrated_db(Path(airflow.env["AIRFLOW_HOME"]) / "airflow.db", airflow_db)
    failed: list[BaseException] = []

    def start() -> None:
        try:
            airflow.start()
        except BaseException as exc:  # re-raised in the fixture
            failed.append(exc)

    starting = threading.Thread(target=start, name="airflow-stack")
    starting.start()  # the components boot while this process does the heavy steps
    try:
        config = ReleaseConfig(model_name=MODEL, eval_set=str(eval_set), **RULES_OFF)
        workspaces = {}
        for name in ("run-a", "run-b"):
            release = open_release(model_root / name, config, settings)
            run_release(release, until="validate")
            workspaces[name] = release.workspace.root
        starting.join(240)
        assert not failed and not starting.is_alive(), f"the Airflow stack did not start: {failed}"
        s = Stack(airflow, settings, airflow.token(), workspaces)
        s.wait(f"the dag-processor to parse {DAG_ID}", lambda: s.rest("GET", f"/api/v2/dags/{DAG_ID}"), 120)
        assert s.rest("GET", "/api/v2/importErrors")["total_entries"] == 0
        assert s.rest("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})["is_paused"] is False
        print(f"\napproval stack ready in {time.perf_counter() - t0:.0f}s")
        yield s
    finally:
        starting.join(240)
        airflow.stop()
        triton.stop()


def _evaluation(workspace: Path) -> dict:
    from seqcls.release.records import EVALUATION

    return json.loads((workspace / EVALUATION).read_text(encoding="utf-8"))


def _shows_the_evaluation(details: dict, evaluation: dict) -> None:
    body = details["body"]
    assert details["options"] == ["Approve", "Reject"] and details["subject"].startswith(f"Release {MODEL} ")
    for who in ("candidate", "champion"):
        if evaluation[who]:
            scores = evaluation[who]
            assert f"| {scores['micro_f1']:.4f} | {scores['macro_f1']:.4f} |" in body, (who, body)
    assert evaluation["summary"] in body, body  # the verdict
    es = evaluation["eval_set"]
    assert f"Eval set `{es['path']}`: {es['texts']} texts" in body and es["sha256"][:12] in body, body
    assert "Failed rules: none" in body and "### Smoke test — " in body and "golden texts answered" in body, body


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_an_approved_release_goes_live(stack: Stack) -> None:
    from seqcls.serving.state import current_state

    t0 = time.perf_counter()
    run_id, details = stack.release_until_approval("run-a")
    evaluation = _evaluation(stack.workspaces["run-a"])
    assert evaluation["champion"] is None and evaluation["candidate"], evaluation  # a first release
    _shows_the_evaluation(details, evaluation)
    print(f"\nwhat the approver sees:\n{details['subject']}\n{details['body']}")
    waiting = current_state(Path(str(stack.settings.triton_repository)), MODEL)
    assert (waiting.serving, waiting.candidate) == (None, 1)  # smoked, loaded as the candidate, not exposed
    state, states = stack.answer(run_id, "Approve")
    assert state == "success", f"{states}\n{stack.log_tail()}"
    assert states.pop("rollback") == "skipped" and set(states.values()) == {"success"}, states
    status = stack.status()
    assert status.agree, status.lines()
    assert (status.recorded["serving"], status.recorded["candidate"], status.registry["champion"]) == (1, None, 1)
    print(f"\napproved release: {time.perf_counter() - t0:.0f}s")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_rejected_release_is_withdrawn(stack: Stack) -> None:
    t0 = time.perf_counter()
    before = stack.status()
    run_id, details = stack.release_until_approval("run-b")
    evaluation = _evaluation(stack.workspaces["run-b"])
    assert evaluation["champion_version"] == before.recorded["serving"], evaluation
    _shows_the_evaluation(details, evaluation)
    state, states = stack.answer(run_id, "Reject")
    assert state == "failed", f"{states}\n{stack.log_tail()}"
    assert states[APPROVE_TASK] == "failed" and states["rollback"] == "success", states
    assert states["expose_version"] == states["promote"] == "upstream_failed", states
    after = stack.status()
    assert after.agree, after.lines()
    recorded = ("serving", "previous", "candidate", "fingerprint")  # the generation counts the withdrawal too
    assert {k: after.recorded[k] for k in recorded} == {k: before.recorded[k] for k in recorded}, after.lines()
    assert after.recorded["candidate"] is None
    for key in ("champion", "champion_fingerprint", "candidate", "expected"):
        assert after.registry[key] == before.registry[key], (key, before.registry, after.registry)
    assert after.endpoints == before.endpoints  # what each Triton endpoint has READY
    print(f"\nrejected release: {time.perf_counter() - t0:.0f}s")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_candidate_below_the_floor_is_refused_by_the_quality_gate_over_rest(stack: Stack) -> None:
    """The run's conf sets a floor no random checkpoint reaches (micro-F1 0.99 on the labeled set):
    ``evaluate_quality`` refuses it before anything is registered or loaded, and names the rule."""
    before = stack.status()
    assert before.recorded["serving"] is not None, before.lines()  # a champion to compare with
    conf = {"checkpoint": "run-b", "min_micro_f1": 0.99, **RULES_DEFAULT}
    run_id = stack.rest("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": conf})["dag_run_id"]

    def finished() -> str | None:
        state = stack.rest("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
        if stack.states(run_id).get(APPROVE_TASK) == "awaiting_input":
            return "let through to approval"
        return state if state in ("success", "failed") else None

    assert stack.wait(f"run {run_id} to finish", finished, 300) == "failed", stack.states(run_id)
    states = stack.states(run_id)
    assert states["evaluate_quality"] == "failed" and states["register_model"] == "upstream_failed", states
    assert states["rollback"] == "skipped", states  # nothing reached the registry or Triton: nothing to undo
    failed = Path(stack.workspaces["run-b"]) / "failed" / "evaluate" / "evaluation.json"
    evaluation = json.loads(failed.read_text(encoding="utf-8"))
    assert not evaluation["passed"] and evaluation["champion_version"] == before.recorded["serving"], evaluation
    assert "min_micro_f1" in [f["rule"] for f in evaluation["failures"]], evaluation["failures"]
    after = stack.status()
    assert after.agree, after.lines()
    assert after.recorded["serving"] == before.recorded["serving"] and after.recorded["candidate"] is None
    assert after.registry["champion"] == before.registry["champion"]
