"""``report_outcome``: the release DAG's last task — how the run ended, told to the model's notify URLs.

**A task, not a DAG callback**: a DAG-level ``on_failure_callback`` runs in the DAG processor and does not
fire under KubernetesExecutor (apache/airflow#63374); a task runs wherever tasks run, and its log shows
what was sent. **A teardown** (``as_teardown()``), downstream of every other task: Airflow 3 derives a
run's state from its leaf tasks (``DagRun.update_state``) — an ordinary ``all_done`` leaf that succeeds
would turn a failed release into a successful run — and leaves teardowns out of that count, so a failed
release still ends failed, a promoted one success. Without setups a teardown's trigger rule
(``all_done_setup_success``) is ``all_done``: it runs after everything, whatever happened.

The outcome (:func:`run_outcome`) comes from the run's task states — which task failed first, whether
``rollback`` ran, whether ``resolve_checkpoint`` skipped the run — plus the reason the failed task gave:
what it pushed as it failed (:func:`records_failure`; pushed before its failure is reported, where a
failure callback would race the scheduler), else its step's record in the release workspace (the heavy
tasks may run where Airflow is not), and the release's versions, gates and what is served now
(:mod:`seqcls.notify.outcome`). A run skipped as already champion sends nothing (the task is skipped):
scheduled runs would otherwise say "nothing new" every time.

The URLs are the models file's ``notify`` (fixed when the DAG file is parsed, kept out of the serialized
DAG) and the Apprise Connection ``notify_conn_id`` (``apache-airflow-providers-apprise``'s ``AppriseHook``
reads its ``config``). Their secret parts are registered with Airflow's secrets masker before anything
is logged; only masked URLs reach the log and XCom. Sending never fails the task: a warning.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowSkipException
from airflow.sdk.log import mask_secret

from seqcls.airflow.context import RESOLVE_TASK, ROLLBACK_TASK, TASK_STEPS
from seqcls.airflow.tasks import APPROVAL_TASK, task_settings
from seqcls.contract.names import ModelName
from seqcls.notify import NotifyResult, Outcome, classify, render, send, split_urls, url_secrets
from seqcls.notify.outcome import (
    APPROVAL,
    RESOLVE,
    UNDO_FAILED,
    UNDONE,
    ReleaseFacts,
    error_reason,
    error_type,
    fill,
    workspace_facts,
)
from seqcls.serving.statelog import actor
from seqcls.steps import BY_NAME

log = logging.getLogger("seqcls.airflow")

#: The release DAG's final (teardown) task.
REPORT_TASK = "report_outcome"
#: XCom key under which a failing task leaves its reason (``"Type: message"``) for :data:`REPORT_TASK`.
FAILURE_KEY = "seqcls_failure"
PROMOTE_TASK = BY_NAME["promote"].task_id


def _stops() -> tuple[str, ...]:
    tasks = list(TASK_STEPS)
    at = tasks.index(BY_NAME["expose"].task_id)  # a person approves between smoke and expose
    return (RESOLVE_TASK, *tasks[:at], APPROVAL_TASK, *tasks[at:])


#: Every task that can stop a release, in run order (the approval only exists with ``approval: required``).
STOPS: tuple[str, ...] = _stops()


def records_failure(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a task's callable) pushing its failure's reason to XCom (:data:`FAILURE_KEY`) as it raises."""

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AirflowSkipException:
            raise
        except BaseException as exc:
            push_failure(exc)
            raise

    return recorded


def failure_text(exc: BaseException) -> str:
    """``"InputError: bad release input: …"``: the type of the error that caused it (an AirflowFailException
    wraps the seqcls error), the message as the task says it, first line, at most 1000 characters."""
    cause = exc.__cause__ if type(exc).__name__ == "AirflowFailException" and exc.__cause__ else exc
    lines = str(exc).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"[:1000]


def push_failure(exc: BaseException) -> None:
    try:
        get_current_context()["ti"].xcom_push(key=FAILURE_KEY, value=failure_text(exc))
    except Exception as push_exc:  # the task's own error matters, not this
        log.debug("failure reason not pushed: %s", push_exc)


def run_outcome(
    model: str, states: Mapping[str, str], failures: Mapping[str, str], facts: ReleaseFacts | None = None
) -> Outcome | None:
    """The run's outcome from its task states (task id → state), the reasons failed tasks pushed, and the
    workspace's facts; None when ``resolve_checkpoint`` skipped the run (already the champion)."""
    if states.get(RESOLVE_TASK) == "skipped":
        return None
    first = next((t for t in STOPS if states.get(t) == "failed"), None)
    if first is None:
        kind, _ = classify(None, promoted=states.get(PROMOTE_TASK) == "success")
        return Outcome(model, kind)
    step = {RESOLVE_TASK: RESOLVE, APPROVAL_TASK: APPROVAL}.get(first) or TASK_STEPS[first]
    error = failures.get(first) or (facts.error if facts and facts.failed_step == step else "")
    kind, gate = classify(step, error_type(error))
    if error:
        reason = error_reason(error)
    elif first == APPROVAL_TASK:
        reason = f"{APPROVAL_TASK} was rejected, not answered in time, or failed"
    else:
        reason = f"{first} failed; its log says why"
    rollback = {"success": UNDONE, "failed": UNDO_FAILED}.get(states.get(ROLLBACK_TASK, ""), "")
    return Outcome(model, kind, reason=reason, step=first, gate=gate, rollback=rollback)


def notify_targets(urls: Sequence[str], conn_id: str | None) -> list[Any]:
    """The URLs, and the services of the Apprise Connection ``conn_id``; every secret part masked first."""
    for url in urls:
        for secret in url_secrets(url):
            mask_secret(secret)
    targets: list[Any] = list(urls)
    if conn_id:
        try:
            targets += connection_services(conn_id)
        except Exception as exc:
            log.warning("notify_conn_id %r: %s — not notified through it", conn_id, exc)
    return targets


def connection_services(conn_id: str) -> list[Any]:
    """The Apprise services an ``apprise`` Connection configures (its ``config``: {path, tag} or a list)."""
    import apprise
    from airflow.providers.apprise.hooks.apprise import AppriseHook

    hook = AppriseHook(apprise_conn_id=conn_id)
    conn = hook.get_connection(conn_id)
    config = hook.get_config_from_conn(conn)
    for entry in config if isinstance(config, list) else [config]:
        for url in split_urls(str(entry.get("path", "")) if isinstance(entry, Mapping) else ""):
            for secret in url_secrets(url) or [url]:
                mask_secret(secret)
    services = apprise.Apprise()
    hook.set_config_from_conn(conn=conn, apprise_obj=services)
    return list(services)


def report_run(
    model: str,
    fingerprint: str,
    params: Any,
    ti: Any,
    *,
    checkpoints_root: str,
    urls: Sequence[str] = (),
    conn_id: str | None = None,
) -> dict[str, Any]:
    """``report_outcome``'s body: work the outcome out, log it, send it; skipped for a skipped run. Never fails."""
    try:
        targets = notify_targets(urls, conn_id)
        outcome = task_outcome(model, fingerprint, params, ti, checkpoints_root=checkpoints_root)
    except Exception as exc:  # never the run's problem
        log.warning("the outcome of this run could not be worked out (%s): nothing sent", exc)
        return {"outcome": None, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if outcome is None:
        raise AirflowSkipException("resolve_checkpoint skipped this run (already the champion): nothing to report")
    title, body = render(outcome)
    log.info("%s\n%s", title, body)
    result = send(targets, outcome) if targets else NotifyResult()
    if not targets:
        log.info("no notify URLs for %s (models file `notify` / `notify_conn_id`): nothing sent", model)
    return {"outcome": outcome.kind, "title": title, **result.to_dict()}


def task_outcome(model: str, fingerprint: str, params: Any, ti: Any, *, checkpoints_root: str) -> Outcome | None:
    """:func:`run_outcome` of this task's DAG run, filled from the workspace and the serving state."""
    model = ModelName(model)  # from the DAG's op_kwargs: where it enters this task
    upstream = sorted(ti.task.upstream_task_ids)
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id], task_ids=upstream).get(ti.run_id, {})
    states = {t: str(getattr(s, "value", s)) for t, s in states.items()}
    failed = [t for t, s in states.items() if s == "failed"]
    failures = {t: ti.xcom_pull(task_ids=t, key=FAILURE_KEY) for t in failed}
    settings = None
    try:
        settings = task_settings(params, checkpoints_root=checkpoints_root)
    except Exception as exc:  # a bad param (what resolve refused): the notification says less
        log.info("release settings not available (%s): versions and serving state not looked up", exc)
    reached = {TASK_STEPS[t] for t, s in states.items() if t in TASK_STEPS and s in ("success", "failed")}
    facts = workspace_facts(settings, model, fingerprint, reached=reached) if settings else None
    outcome = run_outcome(model, states, {t: str(v) for t, v in failures.items() if v}, facts)
    if outcome is None:
        return None
    checkpoint = (params or {}).get("checkpoint") if isinstance(params, Mapping) else None
    outcome.checkpoint = str(checkpoint) if checkpoint else None  # as asked; the workspace's (resolved) wins
    who = actor()
    outcome.user, outcome.host = who.get("user", ""), who.get("host", "")
    outcome.via = f"Airflow {ti.dag_id} run {ti.run_id}"
    with contextlib.suppress(Exception):  # the run's page in the UI (Airflow's own [api] base_url)
        outcome.links["Airflow run"] = str(ti.log_url).split("/tasks/", 1)[0]
    return fill(outcome, facts, settings)


__all__ = [
    "FAILURE_KEY",
    "REPORT_TASK",
    "STOPS",
    "connection_services",
    "failure_text",
    "notify_targets",
    "push_failure",
    "records_failure",
    "report_run",
    "run_outcome",
    "task_outcome",
]
