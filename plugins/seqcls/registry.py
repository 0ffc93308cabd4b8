"""The MLflow model registry as the release ledger: access shared by register, promote and rollback.

MLflow answers "what is live, where did it come from, what do we roll back to":

- ``register`` (:mod:`seqcls.steps.register`): one run per release attempt, a model version with
  lineage tags, alias ``candidate``; idempotent per fingerprint.
- ``promote`` (:mod:`seqcls.steps.promote`): alias ``champion`` → this version, the one it
  replaced kept as ``previous-champion``, every move appended to the ``champion_history`` tag.
- ``undo``: what a rollback calls. Champion moves back if this release had been promoted; an
  alias ``candidate`` this release set is restored; a version this release created (and that
  never became champion) is deleted again — the registry ends exactly as it was, while the
  MLflow *run* stays (tagged ``seqcls.outcome=rolled_back``) as the audit trail.

Aliases and tags, not the deprecated stages. Where MLflow is: see :mod:`seqcls.settings`.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.errors import RegistryError
from seqcls.records import Registered
from seqcls.settings import Settings
from seqcls.workspace import Release

log = logging.getLogger(__name__)

REGISTER_STEP = "register"
PROMOTE_STEP = "promote"
CANDIDATE = "candidate"
CHAMPION = "champion"
PREVIOUS = "previous-champion"
HISTORY_TAG = "champion_history"
HISTORY_KEEP = 20


def tracking_uri(settings: Settings) -> str:
    uri = str(settings.mlflow_tracking_uri)
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    if uri.startswith("file:") or (uri.startswith("/") and not uri.startswith("sqlite")):
        raise RegistryError(
            f"MLflow tracking URI {uri!r} is a file store (in maintenance mode, no model registry features we "
            "rely on); use sqlite:///path/mlflow.db or an http(s):// MLflow server."
        )
    return uri


def client(settings: Settings):
    """An ``MlflowClient`` for the settings' tracking + registry URI (imports mlflow lazily)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(settings)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _experiment(c, settings: Settings, model_name: str) -> str:
    name = f"seqcls-{model_name}"
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if str(settings.mlflow_tracking_uri).startswith("sqlite:"):
        artifacts = settings.mlflow_artifacts_dir / name
        artifacts.mkdir(parents=True, exist_ok=True)
        location = artifacts.as_uri()
    return c.create_experiment(name, artifact_location=location, tags={"seqcls.model_name": model_name})


def _alias(c, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def find_version(c, name: str, fingerprint: str):
    """The model version registered for ``fingerprint`` (newest if several), or None."""
    from mlflow.exceptions import MlflowException

    try:
        found = c.search_model_versions(f"name = '{name}' and tags.fingerprint = '{fingerprint}'")
    except MlflowException:
        found = [v for v in c.search_model_versions(f"name = '{name}'") if v.tags.get("fingerprint") == fingerprint]
    return max(found, key=lambda v: int(v.version)) if found else None


def alias_version(settings: Settings, model_name: str, alias: str) -> int | None:
    """The version an alias points to (None when unset or the model is not registered)."""
    mv = _alias(client(settings), model_name, alias)
    return int(mv.version) if mv is not None else None


def champion_fingerprint(settings: Settings, model_name: str) -> str | None:
    """Fingerprint of the version the ``champion`` alias points to (None: no champion yet)."""
    c = client(settings)
    mv = _alias(c, model_name, CHAMPION)
    return mv.tags.get("fingerprint") if mv is not None else None


def model_version_url(settings: Settings, model_name: str, version: int | str) -> str | None:
    """Where an MLflow UI shows this version (only for an http(s) tracking server)."""
    uri = str(settings.mlflow_tracking_uri)
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/models/{model_name}/versions/{version}"


def _history(c, name: str) -> list[dict[str, Any]]:
    rm = c.get_registered_model(name)
    try:
        return json.loads(rm.tags.get(HISTORY_TAG, "[]"))
    except ValueError:
        return []


def _append_history(c, name: str, entry: dict[str, Any]) -> None:
    history = [*_history(c, name), entry][-HISTORY_KEEP:]
    c.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))


def undo(release: Release, *, reason: str = "", champion: bool = True) -> dict[str, Any]:
    """Leave the registry as it was before this release (see module doc); safe to repeat.

    ``champion=False`` (undoing a failed *attempt*) never moves ``champion``: an attempt that failed
    before ``promote`` did not move it, and the served state it mirrors did not change.
    """
    ws, cfg = release.workspace, release.config
    reg = Registered.find(ws)
    if reg is None or reg.undone:
        return {"changed": False, "why": "nothing registered by this release"}
    version = reg.version
    c = client(release.settings)
    actions: list[str] = []
    current = _alias(c, cfg.model_name, CHAMPION)
    if champion and current is not None and int(current.version) == version:
        previous = _alias(c, cfg.model_name, PREVIOUS)
        if previous is not None:
            c.set_registered_model_alias(cfg.model_name, CHAMPION, previous.version)
            actions.append(f"{CHAMPION} back to version {previous.version}")
            older = [h for h in _history(c, cfg.model_name) if h.get("champion") == int(previous.version)]
            replaced = older[-1].get("replaced") if older else None
            if replaced:
                c.set_registered_model_alias(cfg.model_name, PREVIOUS, str(replaced))
            else:
                c.delete_registered_model_alias(cfg.model_name, PREVIOUS)
        else:
            c.delete_registered_model_alias(cfg.model_name, CHAMPION)
            actions.append(f"{CHAMPION} removed (no previous champion)")
        _append_history(
            c,
            cfg.model_name,
            {
                "champion": int(previous.version) if previous else None,
                "replaced": version,
                "rollback": True,
                "reason": reason[:200],
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
    candidate = _alias(c, cfg.model_name, CANDIDATE)
    if reg.created and candidate is not None and int(candidate.version) == version:
        if reg.previous_candidate:
            c.set_registered_model_alias(cfg.model_name, CANDIDATE, str(reg.previous_candidate))
            actions.append(f"{CANDIDATE} back to version {reg.previous_candidate}")
        else:
            c.delete_registered_model_alias(cfg.model_name, CANDIDATE)
            actions.append(f"{CANDIDATE} removed")
    was_champion = any(h.get("champion") == version for h in _history(c, cfg.model_name))
    if reg.created and not was_champion:
        c.delete_model_version(cfg.model_name, str(version))
        actions.append(f"version {version} deleted (created by this release, never champion)")
        if reg.created_registered_model and not c.search_model_versions(f"name = '{cfg.model_name}'"):
            c.delete_registered_model(cfg.model_name)
            actions.append(f"registered model {cfg.model_name} deleted (created by this release)")
    else:
        c.set_model_version_tag(cfg.model_name, str(version), "seqcls.rolled_back", reason[:500] or "true")
    if reg.run_id:
        try:
            c.set_tag(reg.run_id, "seqcls.outcome", "rolled_back")
        except Exception as exc:  # the run is audit trail only; never block a rollback on it
            log.warning("registry: could not tag run %s: %s", reg.run_id, exc)
    reg.undone, reg.undo_actions = True, actions
    ws.mark(REGISTER_STEP, summary=reg.to_dict())
    log.info("registry: undone for %s version %d — %s", cfg.model_name, version, "; ".join(actions) or "no change")
    return {"changed": bool(actions), "actions": actions, "version": version}


def set_champion(settings: Settings, model_name: str, version: int, triton_version: int | None) -> dict[str, Any]:
    """Point ``champion`` at ``version`` (old champion → ``previous-champion``, history appended).

    Returns ``{"previous": int | None, "already": bool}``; safe to repeat.
    """
    c = client(settings)
    current = _alias(c, model_name, CHAMPION)
    if triton_version is not None:
        c.set_model_version_tag(model_name, str(version), "triton_version", str(triton_version))
    if current is not None and int(current.version) == version:
        return {"previous": None, "already": True}
    if current is not None:
        c.set_registered_model_alias(model_name, PREVIOUS, current.version)
    c.set_registered_model_alias(model_name, CHAMPION, str(version))
    now = datetime.now(UTC).isoformat(timespec="seconds")
    c.set_model_version_tag(model_name, str(version), "champion_since", now)
    replaced = int(current.version) if current else None
    _append_history(
        c, model_name, {"champion": version, "replaced": replaced, "at": now, "triton_version": triton_version}
    )
    return {"previous": replaced, "already": False}


def mirror_champion(settings: Settings, model_name: str, fingerprint: str | None, triton_version: int | None) -> dict:
    """Make ``champion`` the registered version of ``fingerprint`` (what the recorded state serves).

    The registry follows the serving state, never leads it: ``sync`` and rollback call this.
    Returns what changed (``{"champion": N, "previous": M | None, "already": bool}``), or
    ``{"missing": True}`` when no registered version holds that fingerprint.
    """
    if not fingerprint:
        return {"missing": True, "why": "the recorded state names no fingerprint for the served version"}
    mv = find_version(client(settings), model_name, fingerprint)
    if mv is None:
        return {
            "missing": True,
            "why": f"no version of {model_name!r} is registered with fingerprint {fingerprint[:16]}",
        }
    result = set_champion(settings, model_name, int(mv.version), triton_version)
    return {"champion": int(mv.version), **result}
