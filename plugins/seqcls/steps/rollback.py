"""Rollback: what operators mean by it, in two forms — both end in the same reconcile.

- **Undo a failed attempt** (``mode="attempt"``; the pipeline and the DAG's rollback task): drop
  this release's candidate from the recorded state if it is still in flight, reconcile (the
  candidate route and N's composing versions unload; what was served never changed), and
  revert in MLflow only what this attempt changed (a version it created, the ``candidate``
  alias it moved — never ``champion``). A version that was already served before the attempt
  (re-running a release while Triton was down) is left alone: nothing to undo.
- **Roll a release back** (``mode="requested"``; ``seqcls rollback --checkpoint X``): if X is in
  flight, abandon it as above; if X is what is served, serve the recorded previous version
  (:func:`rollback_model`); if X is neither, refuse — it is not something to roll back.

:func:`rollback_model` (``seqcls rollback --model-name NAME``) serves the recorded previous
version and moves ``champion`` to it. Triton first, then the registry: serving the old model
matters more than the ledger and must not wait for (or fail with) an unreachable MLflow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqcls.errors import InputError, ServingError, StepOrderError
from seqcls.registry.ledger import mirror_champion, undo
from seqcls.release import control
from seqcls.release.keys import served_release_key
from seqcls.release.records import OUT_DIRS, published_version
from seqcls.release.workspace import Release, StepResult
from seqcls.serving.client import Endpoint, endpoints_from_settings
from seqcls.serving.lease import ReleaseLease
from seqcls.serving.repository import Repository, ServingOptions
from seqcls.serving.state import ServingState, current_state
from seqcls.settings import Settings

log = logging.getLogger(__name__)

STEP = "rollback"
OUT_DIR = OUT_DIRS[STEP]


def refuse_during_release(repo: Repository, model_name: str) -> None:
    """A live release of ``model_name`` holds its lease: refuse now rather than queue behind it."""
    lease = ReleaseLease(repo.root, model_name)
    holder = lease.holder()
    if holder is not None and control.is_release_owner(holder.owner, model_name) and lease.dead_reason(holder) is None:
        raise ServingError(
            f"a release of {model_name} is in flight (holder {holder.describe()}); retry after it. Nothing was "
            f"changed. If that release is surely dead, `seqcls lease break --model-name {model_name}` first."
        )


def rollback_model(settings: Settings, model_name: str, *, reason: str = "", by: str = "") -> dict[str, Any]:
    """Serve the recorded previous version of ``model_name`` again; champion follows. Under its own lease.

    Asked while a release of the model is in flight (between publish and promote), it refuses at once,
    naming the release: waiting would roll back whatever that release ends up serving — not what was
    served when the rollback was asked. For the same reason, if the served version changed while this
    rollback waited for the lease (a short holder such as ``seqcls sync``, or a release that took it
    just after the check), it refuses too. Nothing is changed by a refusal.
    """
    repo = Repository.from_settings(settings, model_name)
    endpoints = endpoints_from_settings(settings)
    owner = f"rollback:{model_name}:{by or 'cli'}"
    refuse_during_release(repo, model_name)
    asked = current_state(repo.root, model_name).serving
    control.take_lease(repo.root, model_name, owner, STEP)

    def change(s: ServingState) -> ServingState:
        if s.serving != asked:
            raise ServingError(
                f"{model_name}: the served version changed from {asked} to {s.serving} while this rollback waited "
                "for the release lease; nothing was changed. Check `seqcls status` and ask again if still wanted."
            )
        return s.without_candidate(owner, reason).rolled_back(owner, reason)

    try:
        before, after, report = control.transition(repo, model_name, change, endpoints, live_first=False)
        control.require_converged(report, f"rollback of {model_name}")
        key = served_release_key(repo, after.serving)
        registry = _registry(
            lambda: mirror_champion(
                settings, model_name, after.fingerprint_of(after.serving), after.serving, release_key=key
            )
        )
    finally:
        control.give_lease(repo.root, model_name, owner)
    log.warning("rollback: %s serves version %s again (was %s): %s", model_name, after.serving, before.serving, reason)
    return {"rolled_back": True, "from": before.serving, "serving_version": after.serving, "registry": registry}


def _registry(fn) -> dict[str, Any]:
    """Run a registry change; MLflow being down must not fail a rollback that already served the old model."""
    try:
        return fn()
    except Exception as exc:
        log.error("rollback: registry not updated (%s); `seqcls sync` mirrors the champion once MLflow is back", exc)
        return {"error": str(exc)[:500]}


def undo_attempt(release: Release, version: int | None, reason: str, endpoints: Sequence[Endpoint]) -> dict:
    """Drop this release's candidate if still in flight (the registry is reverted after the step)."""
    repo = Repository.from_settings(release.settings, release.config.model_name)
    model = release.config.model_name
    owner = control.release_owner(release)
    state = current_state(repo.root, model)
    summary: dict[str, Any] = {"rolled_back": False, "version": version, "reason": reason}
    if version is not None and state.candidate == version:
        control.take_lease(repo.root, model, owner, STEP)

        def drop(s: ServingState) -> ServingState:
            return s.without_candidate(owner, reason) if s.candidate == version else s

        _, after, report = control.transition(
            repo,
            model,
            drop,
            endpoints,
            keep_previous=ServingOptions.keep_previous_loaded,
        )
        control.require_converged(report, f"withdrawing candidate {version} of {model}")
        summary.update(rolled_back=True, actions=report.actions)
        state = after
    else:
        served = "already the served version before this attempt" if state.serving == version else "not loaded"
        summary["why"] = f"version {version} is {served}; nothing on Triton to undo"
    summary["serving_version"] = state.serving
    control.give_lease(repo.root, model, owner)
    return summary


def rollback(
    release: Release, endpoints: Sequence[Endpoint] | None = None, *, reason: str = "", mode: str = "requested"
) -> StepResult:
    """Undo this release (``attempt``) or roll it back (``requested``, see the module docstring)."""
    if mode not in ("attempt", "requested"):
        raise ValueError(f"rollback mode {mode!r}; expected 'attempt' or 'requested'")
    ws = release.workspace
    try:
        version = published_version(release)
    except StepOrderError:
        version = None
    endpoints = list(endpoints or endpoints_from_settings(release.settings))
    inputs = {"version": version, "endpoints": [e.grpc for e in endpoints], "reason": reason, "mode": mode}

    def body(out: Path) -> tuple[dict, str]:
        state = current_state(Path(str(release.settings.triton_repository)), release.config.model_name)
        if mode == "requested" and version is not None and state.serving == version and state.candidate is None:
            summary = {
                "version": version,
                "reason": reason,
                **rollback_model(release.settings, release.config.model_name, reason=reason),
            }
        elif mode == "requested" and version is not None and state.candidate != version:
            published = ws.step("publish") or {}
            if not (published.get("rolled_back") and published.get("failed_version") == version):
                raise InputError(
                    f"{release.config.model_name} version {version} ({release.checkpoint.origin}) is neither in flight "
                    f"nor served (recorded: serving {state.serving}, candidate {state.candidate}): nothing to roll "
                    f"back. To serve the previous version: `seqcls rollback --model-name {release.config.model_name}`."
                )
            summary = {"rolled_back": False, "version": version, "why": f"version {version} was rolled back already"}
            summary["serving_version"] = state.serving
        else:
            summary = undo_attempt(release, version, reason, endpoints)
        (out / "rollback.json").write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
        if summary.get("rolled_back"):
            served = summary["serving_version"]
            return summary, f"Triton v{version} withdrawn; serving {f'Triton v{served}' if served else 'nothing'} again"
        return summary, f"nothing to roll back: {summary.get('why', '')}"

    result = ws.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
    if result.summary.get("rolled_back"):
        ws.mark("publish", failed_version=version, rolled_back=True, rollback_reason=reason)
    if "registry" not in result.summary:  # an attempt undone: only what it changed in MLflow (never champion)
        result.summary["registry"] = _registry(lambda: undo(release, reason=reason, champion=False))
        ws.mark(STEP, summary=result.summary)
    registry = result.summary.get("registry") or {}
    if registry.get("actions"):
        result.message += "; registry: " + "; ".join(registry["actions"])
    return result
