"""Retention for MLflow model versions: one version per release for ever would hold every release's graphs.

MLflow never deletes a version (nor its files) by itself. gc (:mod:`seqcls.ops.gc`) asks this module, per
model, which versions no serving, rollback, restore or re-scoring can reach and applies the model's policy:

- ``archive`` (default): delete the version's heavy artifacts — the logged model's ONNX graph and the run's
  exported graphs (``paddle_static/``, ``torch_export/``, ``onnx_fp32/``) — and keep the version with its tags,
  metrics, run and small evidence (``parity/``, ``quality/``, tokenizer, config): the audit trail stays.
  Tagged :data:`ARCHIVED_TAG` (when) and :data:`REMOVED_TAG` (what went, bytes per path).
- ``delete``: the same, then the version itself (its run stays, as a rolled-back release's does).
- ``keep``: versions are left alone.

A version archived whose release gc has since compacted (:mod:`seqcls.ops.evidence`: the workspace went, its
audit record stays) also loses what the archive left — the run's evidence and the logged model's small files —
keeping the version, its tags, metrics and run (:func:`plan_compacted`); tagged :data:`COMPACTED_TAG` before,
:data:`COMPACTED_REMOVED_TAG` after, the same way.

Crash safety: :data:`ARCHIVED_TAG` is set *before* anything is deleted, so a release never reuses a version
whose files may be half gone (it registers a new one); :data:`REMOVED_TAG` is set after, so a gc killed in
between finds the version unfinished and completes it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from seqcls import faults
from seqcls.registry.ledger import FINGERPRINT_TAG, is_not_found, mlflow_failed
from seqcls.settings import DEFAULT_GC_MLFLOW_VERSIONS, GC_MLFLOW_POLICIES

log = logging.getLogger(__name__)

ARCHIVE, DELETE, KEEP = GC_MLFLOW_POLICIES
DEFAULT_POLICY = DEFAULT_GC_MLFLOW_VERSIONS
#: Set (ISO time) before the version's heavy artifacts are deleted; a release never reuses such a version.
ARCHIVED_TAG = "seqcls.archived"
#: Set after: JSON ``{"<artifact uri>": bytes}`` of what went. Missing while ARCHIVED_TAG is set: unfinished.
REMOVED_TAG = "seqcls.archived.removed"
#: Set (ISO time) before an archived version of a compacted release loses its remaining artifacts.
COMPACTED_TAG = "seqcls.compacted"
#: Set after: JSON ``{"<artifact uri>": bytes}``. Missing while COMPACTED_TAG is set: unfinished.
COMPACTED_REMOVED_TAG = "seqcls.compacted.removed"
#: The run's artifact directories holding graphs (the register step logs them; the rest is evidence).
HEAVY_RUN_DIRS = ("paddle_static", "torch_export", "onnx_fp32")
#: In the logged model's ``artifacts/``: the served graph (and external data, should a graph have it).
HEAVY_MODEL_SUFFIXES = (".onnx", ".onnx.data", ".onnx_data")


@dataclass
class VersionPlan:
    """One MLflow version gc looked at: kept (``reasons``) or collected (``parts``: artifact URI → bytes)."""

    version: int
    fingerprint: str = ""  # its fingerprint tag's first 16 hex: its release workspace's name
    reasons: list[str] = field(default_factory=list)
    parts: dict[str, int] = field(default_factory=dict)
    unfinished: bool = False  # archived by a gc that did not finish: complete it

    @property
    def collect(self) -> bool:
        return not self.reasons


def _walk(repo, path: str | None = None) -> list[tuple[str, int]]:
    """Every file under ``path`` of an artifact repository, with its size."""
    out: list[tuple[str, int]] = []
    for info in repo.list_artifacts(path):
        if info.is_dir:
            out += _walk(repo, info.path)
        else:
            out.append((info.path, int(info.file_size or 0)))
    return out


def _heavy_parts(c, name: str, mv) -> dict[str, int]:
    """The version's heavy artifacts: artifact-repository root URI + "/" + relative path → bytes."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    parts: dict[str, int] = {}
    model_root = c.get_model_version_download_uri(name, str(mv.version))
    if model_root and not str(model_root).startswith(("models:/", "runs:/")):
        for path, size in _walk(get_artifact_repository(model_root)):
            if path.endswith(HEAVY_MODEL_SUFFIXES):
                parts[f"{model_root.rstrip('/')}/{path}"] = size
    if mv.run_id:
        run_root = c.get_run(mv.run_id).info.artifact_uri
        repo = get_artifact_repository(run_root)
        top = {info.path for info in repo.list_artifacts() if info.is_dir}
        for d in HEAVY_RUN_DIRS:
            if d in top:
                parts[f"{run_root.rstrip('/')}/{d}"] = sum(size for _, size in _walk(repo, d))
    return parts


def _all_versions(c, name: str) -> list:
    """Every version of ``name`` (paged); [] when the model is not registered."""
    from mlflow.exceptions import MlflowException

    out, token = [], None
    try:
        while True:
            page = c.search_model_versions(f"name = '{name}'", max_results=1000, page_token=token)
            out += list(page)
            token = getattr(page, "token", None)
            if not token:
                return out
    except MlflowException as exc:
        if is_not_found(exc):
            return []
        raise mlflow_failed(f"listing versions of {name!r}", exc) from exc


def _aliases(c, name: str) -> dict[int, list[str]] | None:
    """Each version's aliases (None: no registered model ``name``)."""
    from mlflow.exceptions import MlflowException

    aliases: dict[int, list[str]] = {}
    try:
        rm = c.get_registered_model(name)
    except MlflowException as exc:
        if is_not_found(exc):
            return None
        raise mlflow_failed(f"reading registered model {name!r}", exc) from exc
    for alias, version in (getattr(rm, "aliases", None) or {}).items():
        aliases.setdefault(int(version), []).append(alias)
    return aliases


def _listed(lister, c, name: str, mv) -> dict[str, int]:
    """``lister(c, name, mv)``: a version's artifact parts, an MLflow failure named after the version."""
    from mlflow.exceptions import MlflowException

    try:
        return lister(c, name, mv)
    except MlflowException as exc:
        raise mlflow_failed(f"listing the artifacts of version {mv.version} of {name!r}", exc) from exc


def plan(c, name: str, kept_fingerprints: dict[str, list[str]], min_age: float) -> list[VersionPlan]:
    """What to do with each version of ``name`` not yet archived: kept when an alias points to it, when its
    fingerprint (first 16 hex) is one ``kept_fingerprints`` names (why: the reasons given, e.g. "served
    Triton v7"), when registered less than ``min_age`` seconds ago (a release may be between register and
    publish); else collected. A version of a kept fingerprint is kept whatever its serving configuration."""
    aliases = _aliases(c, name)
    if aliases is None:
        return []
    now_ms = time.time() * 1000
    out: list[VersionPlan] = []
    for mv in sorted(_all_versions(c, name), key=lambda v: int(v.version)):
        tags = mv.tags or {}
        unfinished = bool(tags.get(ARCHIVED_TAG)) and REMOVED_TAG not in tags
        if tags.get(REMOVED_TAG) is not None:
            continue  # archived: nothing left to collect
        vp = VersionPlan(int(mv.version), str(tags.get(FINGERPRINT_TAG, ""))[:16], unfinished=unfinished)
        for alias in aliases.get(vp.version, []):
            vp.reasons.append(f"MLflow alias {alias}")
        vp.reasons += kept_fingerprints.get(vp.fingerprint, [])
        age = (now_ms - float(mv.creation_timestamp or now_ms)) / 1000
        if age < min_age:
            vp.reasons.append(f"registered {age:.0f}s ago (< {min_age:.0f}s: a release may be between steps)")
        if vp.collect:
            vp.parts = _listed(_heavy_parts, c, name, mv)
        out.append(vp)
    return out


def _delete_tagged(c, name: str, vp: VersionPlan, started: str, point: str, done: str) -> None:
    """Tag the version ``started`` (unless a killed gc already did), delete its planned files, tag it ``done``
    with what went: a gc killed in between finds it unfinished and completes it."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    version = str(vp.version)
    if not vp.unfinished:
        c.set_model_version_tag(name, version, started, datetime.now(UTC).isoformat(timespec="seconds"))
    faults.point(point)
    for uri in vp.parts:
        root, _, leaf = uri.rpartition("/")
        get_artifact_repository(root).delete_artifacts(leaf)
    c.set_model_version_tag(name, version, done, json.dumps(vp.parts))


def collect(c, name: str, vp: VersionPlan, policy: str) -> None:
    """Archive (or delete) one planned version: tag it archived, delete its heavy artifacts, record what went
    (``delete``: then delete the version). Re-running it on an unfinished version completes it."""
    _delete_tagged(c, name, vp, ARCHIVED_TAG, "gc:mlflow-tagged", REMOVED_TAG)
    if policy == DELETE:
        c.delete_model_version(name, str(vp.version))
    log.info("gc: %s MLflow v%s of %s (%d bytes of artifacts)", policy + "d", vp.version, name, sum(vp.parts.values()))


def _remaining_parts(c, name: str, mv) -> dict[str, int]:
    """Everything left of the version's files: each top-level entry of its logged model and of its run."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    roots = [c.get_model_version_download_uri(name, str(mv.version))]
    if mv.run_id:
        roots.append(c.get_run(mv.run_id).info.artifact_uri)
    parts: dict[str, int] = {}
    for root in roots:
        if not root or str(root).startswith(("models:/", "runs:/")):
            continue
        repo = get_artifact_repository(root)
        for info in repo.list_artifacts():
            size = sum(s for _, s in _walk(repo, info.path)) if info.is_dir else int(info.file_size or 0)
            parts[f"{root.rstrip('/')}/{info.path}"] = size
    return parts


def plan_compacted(c, name: str, fingerprints: set[str]) -> list[VersionPlan]:
    """The archived versions of ``name`` whose release (fingerprint's first 16 hex) was compacted and that still
    hold files: collect what is left of them (an alias on one keeps it)."""
    if not fingerprints:
        return []
    aliased = _aliases(c, name)
    if aliased is None:
        return []
    out = []
    for mv in sorted(_all_versions(c, name), key=lambda v: int(v.version)):
        tags = mv.tags or {}
        fp16 = str(tags.get(FINGERPRINT_TAG, ""))[:16]
        if REMOVED_TAG not in tags or COMPACTED_REMOVED_TAG in tags or fp16 not in fingerprints:
            continue
        if int(mv.version) in aliased:
            continue
        vp = VersionPlan(int(mv.version), fp16, unfinished=bool(tags.get(COMPACTED_TAG)))
        vp.parts = _listed(_remaining_parts, c, name, mv)
        out.append(vp)
    return out


def collect_compacted(c, name: str, vp: VersionPlan) -> None:
    """Delete what is left of an archived version of a compacted release: tagged before, recorded after (a gc
    killed between finds it unfinished and completes it)."""
    _delete_tagged(c, name, vp, COMPACTED_TAG, "gc:mlflow-compacted-tagged", COMPACTED_REMOVED_TAG)
    log.info("gc: MLflow v%s of %s: its remaining %d bytes of artifacts deleted (release compacted)", vp.version, name,
             sum(vp.parts.values()))  # fmt: skip


__all__ = [
    "ARCHIVED_TAG",
    "COMPACTED_REMOVED_TAG",
    "COMPACTED_TAG",
    "DEFAULT_POLICY",
    "REMOVED_TAG",
    "VersionPlan",
    "collect",
    "collect_compacted",
    "plan",
    "plan_compacted",
]
