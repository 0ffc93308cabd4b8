"""What each task of the release and sync DAGs does, so the DAG files only declare the checklist.

The policy a run follows lives here, next to the library calls it makes: which checkpoint a run
releases (``latest`` for scheduled and asset-triggered runs, else the ``checkpoint`` param), that a
DAG releases only its own model, when a run ends skipped (the checkpoint already is champion), which
Connections a task talks through (:func:`connected`), the release lease a serving step holds, what
the champion Asset carries, when rollback has something to undo. Input errors fail the task without
retries (:class:`AirflowFailException`): no retry fixes a bad param, checkpoint or Connection.

The optional human approval (models file ``approval: required``) is here too: :class:`ReleaseApproval`
shows what the gates measured (:func:`approval_summary`, :func:`approval_text`) and waits; a rejection
fails it, and rollback withdraws the candidate as after a failed smoke test.

Runs in the Airflow worker (it reads Connections); the heavy tasks, which may run where Airflow is
not, use :func:`seqcls.airflow.context.run_heavy_step` instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from seqcls import faults
from seqcls.airflow.assets import record_champion
from seqcls.airflow.context import (
    ROLLBACK_ON,
    as_params,
    config_from_params,
    confined_eval_set,
    open_for_task,
    settings_from_params,
)
from seqcls.airflow.hooks import MlflowHook, TritonHook
from seqcls.airflow.models_file import dag_id_for
from seqcls.airflow.report import report
from seqcls.airflow.roots import LATEST, locate_checkpoint
from seqcls.contract.names import ModelName
from seqcls.errors import InputError, ServingError, StepOrderError
from seqcls.ops.gc import after_promote
from seqcls.ops.sync import sync
from seqcls.registry import journal
from seqcls.registry.ledger import champion_fingerprint, champion_release_key
from seqcls.release.control import LeaseContext, give_lease, lease_context, release_owner, take_lease
from seqcls.release.intake import open_release
from seqcls.release.keys import release_key
from seqcls.release.records import EVALUATION
from seqcls.release.workspace import Release
from seqcls.serving.lease import DEFAULT_TTL, ReleaseLease
from seqcls.settings import ENV_AIRFLOW_RUN_URL, Settings, scoped_environ
from seqcls.steps import LEASE_FROM, sigterm_aborts, step
from seqcls.steps.preflight import PreflightError, preflight

log = logging.getLogger("seqcls.airflow")

#: The human approval task of a model whose models-file entry says ``approval: required``.
APPROVAL_TASK = "approve_release"
#: How long a release waits for its answer: unanswered, the task fails and rollback withdraws the candidate.
APPROVAL_TIMEOUT = timedelta(hours=24)


@contextlib.contextmanager
def connected(params: Mapping[str, Any] | str | None, *, checkpoints_root: str | None = None) -> Iterator[Settings]:
    """Settings for a task that talks to Triton or MLflow — the param-named Connections win — with the
    MLflow Connection's credentials in MLflow's own variables, and an ``s3://`` repository's store
    Connection in the AWS ones, for the block (``scoped_environ``)."""
    values = as_params(params)
    triton = TritonHook(values.get("triton_conn_id") or TritonHook.default_conn_name)
    mlflow = MlflowHook(values.get("mlflow_conn_id") or MlflowHook.default_conn_name)
    overrides = {**triton.settings_overrides(), "mlflow_tracking_uri": mlflow.tracking_uri}
    settings = settings_from_params(values, checkpoints_root=checkpoints_root, **overrides)
    with scoped_environ({**mlflow.credentials_env(), **triton.store_env(settings.triton_store)}):
        yield settings


def run_url(ti: Any) -> str | None:
    """The Airflow UI page of this task's DAG run (from the task's own log URL: Airflow's ``[api] base_url``)."""
    try:
        return str(ti.log_url).split("/tasks/", 1)[0] or None
    except Exception:  # a bare task instance in a unit test: no link
        return None


def connection_sources(params: Mapping[str, Any] | str | None) -> dict[str, str]:
    """Where a run's servers come from, as a failed preflight names them: the run's Connections."""
    values = as_params(params)
    triton = values.get("triton_conn_id") or TritonHook.default_conn_name
    mlflow = values.get("mlflow_conn_id") or MlflowHook.default_conn_name
    return {
        "triton": f"the Airflow Connection {triton!r} (extra grpc_endpoints; password: the model-control key)",
        "mlflow": f"the Airflow Connection {mlflow!r} (extra tracking_uri, or host/port)",
    }


def task_settings(params: Mapping[str, Any] | str | None, *, checkpoints_root: str | None = None) -> Settings:
    """:func:`connected`'s settings alone (no credentials in the environment)."""
    with connected(params, checkpoints_root=checkpoints_root) as settings:
        return settings


def resolve_release(model_name: str, checkpoints_root: str, params, dag_run, ti) -> dict:
    """``resolve_checkpoint``: validate params + checkpoint before any heavy work, skip the run when the
    checkpoint already is champion, push what the later tasks re-open (keys ``checkpoint``, ``fingerprint``).

    Automatic runs (scheduled, asset-triggered, backfill) release ``latest`` and always skip a champion;
    manual runs take the ``checkpoint`` param and skip unless ``skip_if_champion`` is off.
    """
    run_type = getattr(dag_run.run_type, "value", dag_run.run_type)
    automatic = run_type != "manual"
    try:  # an InputError is the user's input (params, checkpoint, Connection): no retry can fix it
        with connected(params, checkpoints_root=checkpoints_root) as settings:
            config = confined_eval_set(config_from_params(params), settings)
            if config.model_name != model_name:  # the lease, max_active_runs and the champion Asset are per model
                raise InputError(
                    f"this DAG releases {model_name!r}, not model_name {config.model_name!r}: trigger that "
                    f"model's own DAG ({dag_id_for(config.model_name)!r} when the models file lists it)"
                )
            path = locate_checkpoint(LATEST if automatic else params.get("checkpoint"), settings)
            release = open_release(path, config, settings)
            # params against the checkpoint, the eval set, Triton and MLflow: seconds, before any export
            eval_set = preflight(release, sources=connection_sources(params)).eval_set
            skip = automatic or params.get("skip_if_champion", True)
            reason = champion_skip_reason(release, model_name=config.model_name) if skip else None
    except InputError as exc:  # said first, on one line: the traceback Airflow adds comes after it
        log.error("bad release input: %s", exc)
        raise AirflowFailException(f"bad release input: {exc}") from exc
    except PreflightError as exc:  # a server down may be up at the retry: not a fail-fast
        log.error("%s", exc)
        raise
    if reason:  # said in the log too: the UI shows the skip's reason only under "Post Execute"
        log.info("nothing to release — every task is skipped: %s", reason)
        raise AirflowSkipException(reason)
    ckpt = release.checkpoint
    log.info(
        "%s run releases %s as %r: %d labels, vocab %d, weights %s, fingerprint %s → workspace %s",
        run_type,
        ckpt.origin,
        config.model_name,
        ckpt.num_labels,
        ckpt.vocab_size,
        ckpt.weights.name,
        ckpt.short_fingerprint,
        release.workspace.root,
    )
    ti.xcom_push(key="checkpoint", value=str(ckpt.origin))
    ti.xcom_push(key="fingerprint", value=ckpt.fingerprint)
    return {
        "checkpoint": str(ckpt.origin),
        "fingerprint": ckpt.fingerprint,
        "model_name": config.model_name,
        "labels": ckpt.num_labels,
        "workspace": str(release.workspace.root),
        "eval_set": eval_set.summary() if eval_set else None,
    }


def champion_skip_reason(release: Release, *, model_name: str) -> str | None:
    """Why a run need not release: this checkpoint, with this serving configuration, already is the
    MLflow champion (else None). Same checkpoint with other thresholds is a new release."""
    champion = champion_fingerprint(release.settings, model_name)
    if champion_release_key(release.settings, model_name) == release_key(release):
        return (
            f"checkpoint {release.checkpoint.origin} (fingerprint {release.checkpoint.short_fingerprint}) is "
            f"already the MLflow champion of {model_name!r}: nothing to release"
        )
    log.info(
        "MLflow champion of %r: %s; this checkpoint: %s",
        model_name,
        champion[:16] if champion else "none yet",
        release.checkpoint.short_fingerprint,
    )
    return None


def run_task_step(
    name: str, checkpoint: str, fingerprint: str, params, ti, *, checkpoints_root: str, **kwargs: Any
) -> dict:
    """One DAG task = one library step: settings from Connections, the run's release, the step, its story.

    From register on, steps take the model's release lease as this DAG run (kind ``run``), so the
    run's later tasks — separate processes — re-enter it and another run waits; the run is one
    registry-journal attempt (:mod:`seqcls.registry.journal`), alive while its lease is. Airflow's
    SIGTERM (task timeout) aborts the step (:func:`~seqcls.steps.sigterm_aborts`); the failed task's
    journalled changes — also those of a task SIGKILLed after the grace period — the rollback task undoes.
    """
    run = f"{getattr(ti, 'dag_id', 'dag')}/{getattr(ti, 'run_id', 'run')}"
    faults.point(f"task:before:{name}")  # the team stack's drills change the world here (seqcls.faults)
    with connected(params, checkpoints_root=checkpoints_root) as settings:
        release = open_for_task(checkpoint, params, settings, fingerprint=fingerprint)
        model, owner = release.config.model_name, release_owner(release)
        attempt = journal.Attempt.new(model, owner, kind="run", run=run, workspace=str(release.workspace.root))
        scope = lease_context(LeaseContext(kind="run", run=run))
        link = scoped_environ({ENV_AIRFLOW_RUN_URL: run_url(ti)})  # MLflow tags and the serving log link back
        with scope, link, journal.attempt_scope(attempt), sigterm_aborts(release) as sigterm:
            if name == LEASE_FROM:
                take_lease(Path(str(settings.triton_repository)), model, owner, name)
            result = step(name)(release, **kwargs)
            sigterm.check()
            if name == "expose":  # served: the run's registry changes stay
                journal.end(settings, model, attempt.id, "completed")
            if name == "rollback":
                undone = journal.undo_attempt(settings, model, attempt.id, reason=kwargs.get("reason", ""))
                result.summary["journal"] = undone
        if name == "promote" and not result.summary.get("already"):  # a retry that finds it done moved nothing
            run = as_params(params)  # bounded, logged, never fails:
            after_promote(release, keep_refused=run.get("keep_refused"), mlflow_versions=run.get("mlflow_versions"),
                          evidence_keep=run.get("evidence_keep"),
                          statelog_rotate_bytes=run.get("statelog_rotate_bytes"))  # fmt: skip
    summary = report(result, ti=ti, settings=settings, model_name=release.config.model_name)
    return {**summary, "model_name": release.config.model_name, "fingerprint": release.checkpoint.fingerprint}


def promote_champion(
    model_name: str, checkpoint: str, fingerprint: str, params, ti, outlet_events, *, checkpoints_root: str
) -> dict:
    """``promote``: the step, then the champion Asset's extra on this task's event (emitted on success)."""
    summary = run_task_step("promote", checkpoint, fingerprint, params, ti, checkpoints_root=checkpoints_root)
    record_champion(outlet_events, model_name, summary)
    return summary


def roll_back_failed_attempt(checkpoint: str, fingerprint: str, params, ti, *, checkpoints_root: str) -> dict:
    """``rollback``: withdraw this attempt only when a serving step FAILED in this run (not merely
    upstream-failed); else skip — an earlier failure reached neither the registry nor Triton."""
    watched = (*ROLLBACK_ON, APPROVAL_TASK)  # a rejected (or unanswered) approval withdraws like a failed smoke
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id], task_ids=list(watched))
    states = states.get(ti.run_id, {})
    failed = [t for t in watched if states.get(t) == "failed"]
    if not failed:
        raise AirflowSkipException(f"no serving step failed in this run ({states}); nothing to roll back")
    reason = f"{', '.join(failed)} failed in run {ti.run_id}"
    if failed == [APPROVAL_TASK]:
        reason = f"not approved in run {ti.run_id}: {APPROVAL_TASK} was rejected, timed out or failed"
    if failed == [step(LEASE_FROM).task_id]:  # only the registry was reached, and only the journal knows what
        return undo_registry_attempt(checkpoint, fingerprint, params, ti, reason, checkpoints_root=checkpoints_root)
    kwargs = {"reason": reason, "mode": "attempt"}
    return run_task_step("rollback", checkpoint, fingerprint, params, ti, checkpoints_root=checkpoints_root, **kwargs)


def undo_registry_attempt(checkpoint: str, fingerprint: str, params, ti, reason: str, *, checkpoints_root: str) -> dict:
    """Register failed (or was SIGTERM'd / killed) in this run: undo what the run journalled, give its lease back.

    Not the rollback step: the workspace's register record may be an earlier attempt's, not this run's.
    """
    run = f"{getattr(ti, 'dag_id', 'dag')}/{getattr(ti, 'run_id', 'run')}"
    with connected(params, checkpoints_root=checkpoints_root) as settings:
        release = open_for_task(checkpoint, params, settings, fingerprint=fingerprint)
        model = release.config.model_name
        undone = journal.undo_attempt(settings, model, f"run:{run}", reason=reason)
        give_lease(Path(str(settings.triton_repository)), model, release_owner(release))
    log.info("rollback: registry changes of run %s %s", run, "; ".join(undone["actions"]) or "— none to undo")
    return {"model_name": model, "fingerprint": release.checkpoint.fingerprint, "journal": undone}


class ReleaseApproval(ApprovalOperator):
    """Airflow's ``ApprovalOperator`` asking a person to approve this run's release, with its evidence.

    The subject and body are made when the task runs, from the run's release workspace (found from
    what ``resolve_checkpoint`` pushed, as every task finds it; nothing is read from the request):
    :func:`prepare_approval`. *Reject* fails the task (``fail_on_reject``), so ``rollback`` — downstream
    of it — withdraws the candidate exactly as after a failed smoke test; so does no answer within
    ``response_timeout``. *Approve*: expose and promote run as without approval.
    """

    template_fields = (*ApprovalOperator.template_fields, "checkpoint", "fingerprint")

    def __init__(self, *, checkpoint: str, fingerprint: str, checkpoints_root: str, **kwargs: Any) -> None:
        kwargs.setdefault("response_timeout", APPROVAL_TIMEOUT)
        kwargs.setdefault("subject", "Approve this release?")  # replaced with the release's own when it runs
        super().__init__(fail_on_reject=True, **kwargs)
        self.checkpoint, self.fingerprint, self.checkpoints_root = checkpoint, fingerprint, checkpoints_root

    def execute(self, context: Any) -> Any:
        self.subject, self.body = prepare_approval(
            self.checkpoint,
            self.fingerprint,
            context["params"],
            context["ti"],
            checkpoints_root=self.checkpoints_root,
            wait=self.response_timeout or APPROVAL_TIMEOUT,
        )
        return super().execute(context)


def prepare_approval(
    checkpoint: str, fingerprint: str, params, ti, *, checkpoints_root: str, wait: timedelta
) -> tuple[str, str]:
    """The approval request's subject and body for this run's release, and its release lease renewed to
    outlast ``wait``: the serving tasks renew it as they go, but a person may take hours, and a lapsed
    lease would let ``seqcls sync`` abandon the waiting candidate and another release take the model."""
    run = f"{getattr(ti, 'dag_id', 'dag')}/{getattr(ti, 'run_id', 'run')}"
    with connected(params, checkpoints_root=checkpoints_root) as settings:
        release = open_for_task(checkpoint, params, settings, fingerprint=fingerprint)
        summary = approval_summary(release)
        lease = ReleaseLease(Path(str(settings.triton_repository)), release.config.model_name)
        ttl = wait.total_seconds() + DEFAULT_TTL
        lease.acquire(release_owner(release), kind="run", run=run, step="approval", timeout=0, ttl=ttl)
    q = summary["quality"]
    log.info(
        "approval asked for %s version %s: quality gate %s; candidate %s, champion %s; smoke: %s",
        summary["model_name"],
        summary["version"],
        q["verdict"],
        q["candidate"],
        q["champion"],
        summary["smoke"]["message"],
    )
    return approval_text(summary)


def approval_summary(release: Release) -> dict[str, Any]:
    """What a person approving the release is shown, from its workspace's records: the quality gate's
    verdict and numbers (``quality/evaluation.json``) and the smoke test's result (its step record).

    Both steps must have succeeded in this workspace (StepOrderError otherwise): evidence that is
    missing must not be approved blind.
    """
    ws = release.workspace
    evaluated, smoked = ws.require("evaluate"), ws.require("smoke")
    path = ws.path(EVALUATION)
    if not path.is_file():
        raise StepOrderError(f"{path}: the quality gate's record is missing; run evaluate_quality for this release")
    evaluation = json.loads(path.read_text(encoding="utf-8"))

    def f1(who: str) -> dict[str, float] | None:
        scores = evaluation.get(who)
        return {k: scores[k] for k in ("micro_f1", "macro_f1")} if scores else None

    smoke = smoked.get("summary") or {}
    return {
        "model_name": release.config.model_name,
        "fingerprint": release.checkpoint.fingerprint,
        "checkpoint": str(release.checkpoint.origin),
        "workspace": str(ws.root),
        "version": smoke.get("version"),
        "quality": {
            "passed": evaluation.get("passed"),
            "verdict": evaluation.get("summary") or evaluated.get("message", ""),
            "candidate": f1("candidate"),
            "champion": f1("champion"),
            "champion_version": evaluation.get("champion_version"),
            "eval_set": evaluation.get("eval_set"),
            "failures": evaluation.get("failures") or [],
            "skipped": evaluation.get("skipped") or [],
            "champion_disagreements": evaluation.get("champion_disagreements"),
            "bad_cases": evaluation.get("bad_cases"),
        },
        "smoke": {
            "message": smoked.get("message", ""),
            **{k: smoke.get(k) for k in ("texts", "p50_ms", "p95_ms", "endpoints", "route")},
        },
    }


def approval_text(summary: Mapping[str, Any]) -> tuple[str, str]:
    """:func:`approval_summary` as the request's subject and Markdown body (what the UI shows)."""
    q, smoke, version = summary["quality"], summary["smoke"], summary["version"]
    model = ModelName(summary["model_name"])  # from XCom: where it enters this task
    gate = "did not run" if q["candidate"] is None else "passed" if q["passed"] else "refused"
    fingerprint = summary["fingerprint"]
    subject = f"Release {model} (Triton v{version}, fingerprint {fingerprint[:12]})? Quality gate {gate}"
    route = smoke.get("route") or model.names.candidate
    lines = [
        f"**{model}**: checkpoint `{summary['checkpoint']}` (fingerprint `{fingerprint[:16]}`) as Triton "
        f"version **{version}**, loaded as the candidate on `{route}`; the public `{model.names.ensemble}` "
        "does not serve it yet.",
        "",
        f"### Quality gate — {q['verdict']}",
    ]
    if q["candidate"]:
        rows = [("candidate", q["candidate"])]
        if q["champion"]:
            rows.append((f"champion (Triton v{q['champion_version']})", q["champion"]))
        lines += ["", "| | micro-F1 | macro-F1 |", "|---|---|---|"]
        lines += [f"| {who} | {s['micro_f1']:.4f} | {s['macro_f1']:.4f} |" for who, s in rows]
    if es := q["eval_set"]:
        lines += ["", f"Eval set `{es['path']}`: {es['texts']} texts ({es['source']}), sha256 `{es['sha256'][:12]}`."]
        if q["champion_disagreements"] is not None:
            lines.append(f"Label sets that differ from the champion's: {q['champion_disagreements']} of {es['texts']}.")
    failures = [f"{f['rule']} on {f['metric']}: {f['candidate']} vs {f['champion']}" for f in q["failures"]]
    lines.append(f"Bad cases: {q['bad_cases']}. Failed rules: {'; '.join(failures) or 'none'}.")
    if q["skipped"]:
        lines.append("Skipped: " + "; ".join(q["skipped"]) + ".")
    lines += [
        "",
        f"### Smoke test — {smoke['message']}",
        "",
        f"Evidence: `{summary['workspace']}/quality/` (evaluation.json, bad_cases.tsv, labels.png) and the release's "
        "MLflow run.",
        "",
        f"**Approve**: `{model.names.ensemble}` serves version {version}, which becomes the MLflow champion. "
        "**Reject**: the candidate is withdrawn (rollback); what is served and the champion stay as they are.",
    ]
    return subject, "\n".join(lines)


def sync_task(params, groups: list[dict[str, Any]] | None = None) -> list[dict]:
    """The seqcls_sync DAG's task: ``seqcls sync`` with the Connections; fails naming what did not converge.

    ``groups`` (from the models file, :func:`seqcls.airflow.models_file.sync_groups`): per Connection
    pair, the models to sync through it (``models`` None = every model of that repository).
    """
    results = []
    for group in groups or [{}]:
        conns = {k: group[k] for k in ("triton_conn_id", "mlflow_conn_id") if group.get(k)}
        with connected({**as_params(params), **conns}) as settings:
            results += sync(settings, group.get("models"))
    for r in results:
        log.info(
            "sync %s: serving %s, actions %s, registry %s", r.model_name, r.serving, r.actions or "none", r.registry
        )
    failed = [r for r in results if not r.ok]
    if failed:
        raise ServingError(
            "not in sync: " + "; ".join(f"{r.model_name}: {r.errors or r.registry.get('error')}" for r in failed)
        )
    return [r.to_dict() for r in results]


__all__ = [
    "APPROVAL_TASK",
    "APPROVAL_TIMEOUT",
    "ReleaseApproval",
    "approval_summary",
    "approval_text",
    "champion_skip_reason",
    "connected",
    "prepare_approval",
    "promote_champion",
    "resolve_release",
    "roll_back_failed_attempt",
    "run_task_step",
    "sync_task",
    "task_settings",
    "undo_registry_attempt",
]
