"""The MLflow model registry as the release ledger: access shared by register, promote and rollback.

MLflow answers "what is live, where did it come from, what do we roll back to":

- ``register`` (:mod:`seqcls.steps.register`): one run per release attempt, a model version with
  lineage tags, alias ``candidate``; idempotent per :func:`~seqcls.release.keys.release_key` — one
  registered model per model name, one version per (checkpoint fingerprint, serving configuration).
- ``promote`` (:mod:`seqcls.steps.promote`): alias ``champion`` → this version, the one it
  replaced kept as ``previous-champion``, every move appended to the ``champion_history`` tag.
- ``undo``: what a rollback calls. Champion moves back if this release had been promoted; an
  alias ``candidate`` this release set is restored; a version this release created (and that
  never became champion) is deleted again — the registry ends exactly as it was, while the
  MLflow *run* stays (tagged ``seqcls.outcome=rolled_back``) as the audit trail.

Aliases and tags, not the deprecated stages. Where MLflow is: see :mod:`seqcls.settings`.
An MLflow failure (a locked database, a 5xx, a server that is down) is a :class:`RegistryError`,
never mistaken for "no such alias" or "no such version".
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.errors import RegistryError
from seqcls.files import held
from seqcls.release.records import Registered
from seqcls.release.workspace import Release
from seqcls.settings import MLFLOW_CREDENTIAL_VARS, Settings, check_tracking_uri

log = logging.getLogger(__name__)

REGISTER_STEP = "register"
PROMOTE_STEP = "promote"
CANDIDATE = "candidate"
CHAMPION = "champion"
PREVIOUS = "previous-champion"
HISTORY_TAG = "champion_history"
HISTORY_KEEP = 20
RELEASE_KEY_TAG = "release_key"
SERVING_CONFIG_TAG = "serving_config"
FINGERPRINT_TAG = "fingerprint"
CHAMPION_SINCE_TAG = "champion_since"


def version_label(triton: int | None, mlflow: int | None) -> str:
    """The project's one way to name a release: "Triton v5 (MLflow v1)" — each side alone when the other is unknown."""
    if triton is None:
        return f"MLflow v{mlflow}" if mlflow is not None else "none"
    return f"Triton v{triton} (MLflow v{mlflow})" if mlflow is not None else f"Triton v{triton}"


def _untag(c, name: str, version: int, tag: str) -> None:
    """Remove a version's tag (a version or tag already gone is fine)."""
    from mlflow.exceptions import MlflowException

    try:
        c.delete_model_version_tag(name, str(version), tag)
    except MlflowException as exc:
        if not is_not_found(exc):
            raise mlflow_failed(f"removing tag {tag!r} of version {version} of {name!r}", exc) from exc


def tracking_uri(settings: Settings) -> str:
    """The settings' URI, checked: never a file store, never with credentials (they go in MLflow's variables)."""
    uri = check_tracking_uri(str(settings.mlflow_tracking_uri), f"set {' / '.join(MLFLOW_CREDENTIAL_VARS)} instead")
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
    if not opens_database(uri) or uri in _DB_READY:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    # Two releases (of two models) starting at once on a fresh database would both run MLflow's
    # schema migrations and one would fail ("Online migration expected to match one row"): create
    # and migrate the stores (the client's constructor and first registry call do) under a file lock —
    # beside a sqlite file, else in the home every worker shares (a PostgreSQL store opened directly).
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        lock = db.with_name(db.name + ".seqcls-init.lock")
    else:
        lock = Path(settings.home) / "mlflow" / f".seqcls-init-{hashlib.sha256(uri.encode()).hexdigest()[:16]}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
    with held(lock, timeout=300, what="MLflow set-up", error=RegistryError):
        c = MlflowClient(tracking_uri=uri, registry_uri=uri)
        c.search_registered_models(max_results=1)
    _DB_READY.add(uri)
    return c


_DB_READY: set[str] = set()
#: MLflow's database stores (``<dialect>[+driver]://``): the client itself opens them, no server between.
DATABASE_DIALECTS = ("sqlite", "postgresql", "mysql", "mssql")


def opens_database(uri: str) -> bool:
    """Whether the client opens the store itself (sqlite, or PostgreSQL/MySQL/MSSQL by URI) rather than asking an
    MLflow server: then seqcls, not a server, decides where artifacts go and serialises the schema set-up."""
    scheme = uri.partition("://")[0] if "://" in uri else ""
    return scheme.split("+", 1)[0].lower() in DATABASE_DIALECTS


def experiment(c, settings: Settings, model_name: str) -> str:
    """The id of experiment ``seqcls-<model>`` (created on first use; its artifacts beside a database store).

    Two releases of a new model validate at once outside the lease (two Airflow runs, two workers): both
    may find no experiment and both create it; the one MLflow refuses (``RESOURCE_ALREADY_EXISTS``) uses
    the other's instead of losing its evidence.
    """
    from mlflow.exceptions import MlflowException

    name = f"seqcls-{model_name}"
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None  # a server's store: its own artifact root (proxied); a database store: under the shared home,
    if opens_database(str(settings.mlflow_tracking_uri)):  # never MLflow's ./mlruns in the process's directory
        artifacts = settings.mlflow_artifacts_dir / name
        artifacts.mkdir(parents=True, exist_ok=True)
        location = artifacts.as_uri()
    try:
        return c.create_experiment(name, artifact_location=location, tags={"seqcls.model_name": model_name})
    except MlflowException as exc:
        if (
            getattr(exc, "error_code", None) != "RESOURCE_ALREADY_EXISTS"
            or (exp := c.get_experiment_by_name(name)) is None
        ):
            raise
        log.info("MLflow experiment %s was created by another release at the same moment; using it", name)
        return exp.experiment_id


def mlflow_failed(what: str, exc: Exception) -> RegistryError:
    """The error for an MLflow call that failed while doing ``what`` (never "not found": see :func:`is_not_found`)."""
    return RegistryError(f"MLflow failed {what}: {exc}")


def is_not_found(exc: Exception) -> bool:
    """MLflow's "no such model / alias" (the SQL store, and a REST server relaying it), nothing else.

    A missing registered model is ``RESOURCE_DOES_NOT_EXIST``; a missing alias is
    ``INVALID_PARAMETER_VALUE`` "Registered model alias X not found." (mlflow 3.x SQL store). A
    locked database (``TEMPORARILY_UNAVAILABLE``), a 5xx (``INTERNAL_ERROR``...) or a proxy's
    404 without MLflow's JSON (``ENDPOINT_NOT_FOUND``) is not "not found".
    """
    code = getattr(exc, "error_code", None)
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in str(exc))


def aliased_version(c, name: str, alias: str):
    """The version ``alias`` points to; None only when MLflow says the model or alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if is_not_found(exc):
            return None
        raise mlflow_failed(f"reading alias {alias!r} of {name!r}", exc) from exc


def version_exists(c, name: str, version: int) -> bool:
    """Whether version ``version`` of ``name`` exists (an MLflow failure is a RegistryError, not "no")."""
    from mlflow.exceptions import MlflowException

    try:
        c.get_model_version(name, str(version))
        return True
    except MlflowException as exc:
        if is_not_found(exc):
            return False
        raise mlflow_failed(f"reading version {version} of {name!r}", exc) from exc


def _tagged(c, name: str, tag: str, value: str) -> list:
    """Versions of ``name`` whose tag ``tag`` is ``value``."""
    from mlflow.exceptions import MlflowException

    try:
        return list(c.search_model_versions(f"name = '{name}' and tags.{tag} = '{value}'"))
    except MlflowException as exc:
        if getattr(exc, "error_code", None) != "INVALID_PARAMETER_VALUE":
            raise mlflow_failed(f"searching versions of {name!r}", exc) from exc
    # a registry that rejects tag filters (INVALID_PARAMETER_VALUE): filter every version of the model here
    try:
        return [v for v in c.search_model_versions(f"name = '{name}'") if v.tags.get(tag) == value]
    except MlflowException as exc:
        raise mlflow_failed(f"listing versions of {name!r}", exc) from exc


def _newest(versions: list):
    return max(versions, key=lambda v: int(v.version)) if versions else None


def find_version(c, name: str, fingerprint: str | None, *, release_key: str | None = None):
    """The version registered for this release (newest if several), or None.

    With ``release_key``: the version tagged with it; else (fallback) a version registered before
    release keys existed — tagged with ``fingerprint`` and no ``release_key`` at all (a version
    with another key holds another serving configuration, never this one). Without it (a Triton
    version published before release keys): such a legacy version of ``fingerprint`` first, else
    any version of it.
    """
    if release_key:
        keyed = _newest(_tagged(c, name, RELEASE_KEY_TAG, release_key))
        if keyed is not None:
            return keyed
    if not fingerprint:
        return None
    found = _tagged(c, name, FINGERPRINT_TAG, fingerprint)
    legacy = _newest([v for v in found if not v.tags.get(RELEASE_KEY_TAG)])
    return legacy if release_key or legacy is not None else _newest(found)


def registered_version(
    settings: Settings, model_name: str, fingerprint: str | None, *, release_key: str | None = None
) -> int | None:
    """The registry version standing for a served Triton version — the one :func:`mirror_champion`
    makes champion (``status`` compares the champion with it); None when none is registered."""
    mv = find_version(client(settings), model_name, fingerprint, release_key=release_key)
    return int(mv.version) if mv is not None else None


def version_artifacts(
    settings: Settings, model_name: str, fingerprint: str | None, release_key: str | None, dst: Path
) -> Path | None:
    """The artifacts of the MLflow version that holds ``fingerprint`` (and ``release_key``), downloaded under
    ``dst`` — copies of a published Triton version's files to check against its pinned hashes (the served
    ONNX, the serving tokenizer's file). None: no such version, or MLflow cannot be read (a warning)."""
    try:
        c = client(settings)
        mv = find_version(c, model_name, fingerprint, release_key=release_key)
        if mv is None:
            return None
        import mlflow

        uri = f"models:/{model_name}/{mv.version}"
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst)))
    except Exception as exc:  # MLflow down or the artifacts gone: one source fewer, said
        log.warning("MLflow version of %s %s: artifacts not read (%s)", model_name, fingerprint, exc)
        return None


def alias_version(settings: Settings, model_name: str, alias: str) -> int | None:
    """The version an alias points to (None when unset or the model is not registered)."""
    mv = aliased_version(client(settings), model_name, alias)
    return int(mv.version) if mv is not None else None


def champion_fingerprint(settings: Settings, model_name: str) -> str | None:
    """Fingerprint of the version the ``champion`` alias points to (None: no champion yet)."""
    c = client(settings)
    mv = aliased_version(c, model_name, CHAMPION)
    return mv.tags.get(FINGERPRINT_TAG) if mv is not None else None


def champion_release_key(settings: Settings, model_name: str) -> str | None:
    """Release key of the ``champion`` version (None: no champion, or one registered before release keys)."""
    mv = aliased_version(client(settings), model_name, CHAMPION)
    return mv.tags.get(RELEASE_KEY_TAG) if mv is not None else None


def model_version_url(settings: Settings, model_name: str, version: int | str) -> str | None:
    """Where an MLflow UI shows this version (only for an http(s) tracking server)."""
    uri = str(settings.mlflow_tracking_uri)
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/models/{model_name}/versions/{version}"


def history(c, name: str) -> list[dict[str, Any]]:
    """Every champion move of ``name`` (its ``champion_history`` tag; [] when unreadable)."""
    rm = c.get_registered_model(name)
    try:
        return json.loads(rm.tags.get(HISTORY_TAG, "[]"))
    except ValueError:
        return []


def _append_history(c, name: str, entry: dict[str, Any]) -> None:
    entries = [*history(c, name), entry][-HISTORY_KEEP:]
    c.set_registered_model_tag(name, HISTORY_TAG, json.dumps(entries))


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
    current = aliased_version(c, cfg.model_name, CHAMPION)
    if champion and current is not None and int(current.version) == version:
        previous = aliased_version(c, cfg.model_name, PREVIOUS)
        if previous is not None:
            c.set_registered_model_alias(cfg.model_name, CHAMPION, previous.version)
            actions.append(f"{CHAMPION} back to version {previous.version}")
            older = [h for h in history(c, cfg.model_name) if h.get("champion") == int(previous.version)]
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
    candidate = aliased_version(c, cfg.model_name, CANDIDATE)
    if reg.created and candidate is not None and int(candidate.version) == version:
        if reg.previous_candidate:
            c.set_registered_model_alias(cfg.model_name, CANDIDATE, str(reg.previous_candidate))
            actions.append(f"{CANDIDATE} back to version {reg.previous_candidate}")
        else:
            c.delete_registered_model_alias(cfg.model_name, CANDIDATE)
            actions.append(f"{CANDIDATE} removed")
    was_champion = any(h.get("champion") == version for h in history(c, cfg.model_name))
    if reg.created and not was_champion and not version_exists(c, cfg.model_name, version):
        log.info("registry: version %d of %s was deleted already (a dead attempt undone)", version, cfg.model_name)
    elif reg.created and not was_champion:
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
    current = aliased_version(c, model_name, CHAMPION)
    if triton_version is not None:
        c.set_model_version_tag(model_name, str(version), "triton_version", str(triton_version))
    if current is not None and int(current.version) == version:
        return {"previous": None, "already": True}
    if current is not None:
        c.set_registered_model_alias(model_name, PREVIOUS, current.version)
    c.set_registered_model_alias(model_name, CHAMPION, str(version))
    now = datetime.now(UTC).isoformat(timespec="seconds")
    c.set_model_version_tag(model_name, str(version), CHAMPION_SINCE_TAG, now)
    if current is not None:  # only the champion says since when it is one; the history keeps the rest
        _untag(c, model_name, int(current.version), CHAMPION_SINCE_TAG)
    replaced = int(current.version) if current else None
    _append_history(
        c, model_name, {"champion": version, "replaced": replaced, "at": now, "triton_version": triton_version}
    )
    return {"previous": replaced, "already": False}


def mirror_champion(
    settings: Settings,
    model_name: str,
    fingerprint: str | None,
    triton_version: int | None,
    *,
    release_key: str | None = None,
) -> dict:
    """Make ``champion`` the registered version of what the recorded state serves.

    ``release_key`` (from the served Triton version's ``release.json``) names that version; a
    served version published before release keys gives only ``fingerprint`` (see
    :func:`find_version` for both fallbacks). The registry follows the serving state, never leads
    it: ``sync`` and rollback call this. Returns what changed (``{"champion": N, "previous": M |
    None, "already": bool}``), or ``{"missing": True, "why": ...}`` when no registered version matches.
    """
    if not fingerprint and not release_key:
        return {"missing": True, "why": "the recorded state names no fingerprint for the served version"}
    mv = find_version(client(settings), model_name, fingerprint, release_key=release_key)
    if mv is None:
        key = f" (serving configuration {release_key})" if release_key else ""
        return {"missing": True, "why": f"no version of {model_name!r} holds fingerprint {str(fingerprint)[:16]}{key}"}
    result = set_champion(settings, model_name, int(mv.version), triton_version)
    return {"champion": int(mv.version), **result}
