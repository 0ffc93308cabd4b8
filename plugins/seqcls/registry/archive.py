"""Retention for MLflow model versions: one version per release for ever would hold every release's graphs.

MLflow never deletes a version (nor its files) by itself. gc (:mod:`seqcls.ops.gc`) asks this module, per
model, which versions no serving, rollback, restore or re-scoring can reach and applies the model's policy:

- ``archive`` (default): delete the version's heavy artifacts — the logged model's ONNX graph with what only
  loads it (the pyfunc's code, character classes, input examples, environment files: all but
  :data:`MODEL_AUDIT_FILES`) and the run's exported graphs (``paddle_static/``, ``torch_export/``,
  ``onnx_fp32/``) — and keep the version with its tags, metrics, run and small evidence (``parity/``,
  ``quality/``, tokenizer, config; the model's MLmodel, release.json, tokenizer file): the audit trail stays.
  Tagged :data:`ARCHIVED_TAG` (when) and :data:`REMOVED_TAG` (what went, bytes per path).
- ``delete``: the same, then the version itself (its run stays, as a rolled-back release's does).
- ``keep``: versions are left alone.

A version archived whose release gc has since compacted (:mod:`seqcls.ops.evidence`: the workspace went, its
audit record stays) also loses what the archive left — the run's evidence and the logged model's small files —
keeping the version, its tags, metrics and run (:func:`plan_compacted`); tagged :data:`COMPACTED_TAG` before,
:data:`COMPACTED_REMOVED_TAG` after, the same way.

Runs no version names hold the same evidence and more of it: a release the quality or parity gate refused, a
re-release of a registered configuration (its gates re-ran: ``seqcls.outcome=reused``), a registration that
failed. No version is archived for them, so before :func:`plan_runs` their files stayed for ever (≈ 110 kB each:
parity report, expected decisions, plots, quality evaluation). Their artifacts now go when their release's
workspace is gone (compacted to its audit record or collected) — the evidence bound ``evidence_keep`` — and a
re-release's as soon as a newer re-release of the same release stands for it; the run, its tags (the gate's
error, the version it reused) and metrics stay. Tagged :data:`RUN_COLLECTING_TAG` before,
:data:`RUN_REMOVED_TAG` after.

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
#: Set (ISO time) on a run no version names before its artifacts are deleted (:func:`collect_run`).
RUN_COLLECTING_TAG = "seqcls.artifacts.collecting"
#: Set after: JSON ``{"<artifact uri>": bytes}``. Missing while RUN_COLLECTING_TAG is set: unfinished.
RUN_REMOVED_TAG = "seqcls.artifacts.removed"
#: A run's outcome tag, the re-release and the registered outcomes (:mod:`seqcls.registry.runs`, not imported: it
#: is a floor up).
OUTCOME_TAG, REUSED, REGISTERED = "seqcls.outcome", "reused", "registered"
#: The run's artifact directories holding graphs (the register step logs them; the rest is evidence).
HEAVY_RUN_DIRS = ("paddle_static", "torch_export", "onnx_fp32")
#: What an archived version's logged model keeps (paths under its artifact root): its MLmodel (signature,
#: metadata), the served configuration, the served tokenizer file and the pinned requirements — what an audit
#: reads. The rest (the pyfunc's code, the tokenizer's character classes, input examples, environment files)
#: only loads a model whose graph is gone: it goes with the graph.
MODEL_AUDIT_FILES = ("MLmodel", "requirements.txt", "artifacts/release.json", "artifacts/vocab.txt",
                     "artifacts/tokenizer.json")  # fmt: skip


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
        mixed = {f.split("/")[0] for f in MODEL_AUDIT_FILES if "/" in f}  # directories an audit file is in
        for path, size in _walk(get_artifact_repository(model_root)):
            if path not in MODEL_AUDIT_FILES:  # a directory none is in goes whole (one delete, no empty dirs)
                key = f"{model_root.rstrip('/')}/{path if path.split('/')[0] in mixed else path.split('/')[0]}"
                parts[key] = parts.get(key, 0) + size
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

    roots = [c.get_model_version_download_uri(name, str(mv.version))]
    if mv.run_id:
        roots.append(c.get_run(mv.run_id).info.artifact_uri)
    parts: dict[str, int] = {}
    for root in roots:
        parts.update(_root_parts(root))
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


@dataclass
class RunPlan:
    """A run no model version names whose artifacts gc collects (``parts``: artifact URI → bytes), and why."""

    run_id: str
    fingerprint: str  # first 16 hex: its release workspace's name
    outcome: str  # its seqcls.outcome tag: quality_failed, gate_failed, reused, failed...
    why: str
    parts: dict[str, int] = field(default_factory=dict)
    unfinished: bool = False  # tagged by a gc that did not finish: complete it


def _runs(c, experiment_id: str, registered: bool) -> list:
    """The runs of the experiment that are not running (paged), newest first; without ``registered``, only those
    whose outcome is not ``registered`` — a version's own run, the bulk of a daily schedule's runs: MLflow filters
    them out, so the search does not load every run's metrics and params once a day for ever."""
    where = "attributes.status != 'RUNNING'"
    if not registered:
        where += f" AND tags.`{OUTCOME_TAG}` != '{REGISTERED}'"
    out, token = [], None
    while True:
        page = c.search_runs([experiment_id], where, max_results=1000, page_token=token,
                             order_by=["attributes.start_time DESC"])  # fmt: skip
        out += list(page)
        token = getattr(page, "token", None)
        if not token:
            return out


def plan_runs(c, name: str, compacted: set[str], *, registered: bool = False) -> list[RunPlan]:
    """The runs of experiment ``seqcls-<name>`` that no version of ``name`` names and whose artifacts are debris:
    their release (fingerprint's first 16 hex) is one of ``compacted`` (its workspace went, its audit record stands
    for it: the ``evidence_keep`` bound), or they re-ran the gates of a registered release (``reused``) and a
    newer such run of the same release exists (the newest keeps its evidence; the version's own run keeps the
    first). Runs still running, without a fingerprint tag (not a release's) or already collected are left alone.
    A ``registered`` run is a version's and not searched unless ``registered`` (the ``delete`` policy: its version
    may be gone)."""
    from mlflow.exceptions import MlflowException

    try:
        exp = c.get_experiment_by_name(f"seqcls-{name}")
        if exp is None:
            return []
        named = {mv.run_id for mv in _all_versions(c, name) if mv.run_id}
        found = _runs(c, exp.experiment_id, registered)
    except MlflowException as exc:
        raise mlflow_failed(f"listing the runs of experiment seqcls-{name}", exc) from exc
    out: list[RunPlan] = []
    reused: set[str] = set()  # releases whose newest re-release run was seen (runs come newest first)
    for run in found:
        tags = run.data.tags
        fp16, outcome = str(tags.get(FINGERPRINT_TAG, ""))[:16], str(tags.get(OUTCOME_TAG, ""))
        if run.info.run_id in named or not fp16 or RUN_REMOVED_TAG in tags:
            continue
        newer = outcome == REUSED and fp16 in reused
        if outcome == REUSED:
            reused.add(fp16)
        if fp16 in compacted:
            why = "its release was compacted (its audit record stands for it)"
        elif newer:
            why = "a newer re-release of the same release re-ran its gates"
        else:
            continue
        rp = RunPlan(run.info.run_id, fp16, outcome, why, unfinished=bool(tags.get(RUN_COLLECTING_TAG)))
        rp.parts = _root_parts(run.info.artifact_uri)
        if rp.parts or rp.unfinished:
            out.append(rp)
    return out


def _root_parts(root: str) -> dict[str, int]:
    """Each top-level entry under an artifact root with its bytes (files under a directory summed)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    if not root or str(root).startswith(("models:/", "runs:/")):
        return {}
    repo = get_artifact_repository(root)
    parts: dict[str, int] = {}
    for info in repo.list_artifacts():
        size = sum(s for _, s in _walk(repo, info.path)) if info.is_dir else int(info.file_size or 0)
        parts[f"{root.rstrip('/')}/{info.path}"] = size
    return parts


def collect_run(c, rp: RunPlan) -> None:
    """Delete a planned run's artifacts: tagged :data:`RUN_COLLECTING_TAG` before, :data:`RUN_REMOVED_TAG` (what
    went) after — a gc killed in between finds the run unfinished and completes it. The run, its tags and metrics
    stay."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    if not rp.unfinished:
        c.set_tag(rp.run_id, RUN_COLLECTING_TAG, datetime.now(UTC).isoformat(timespec="seconds"))
    faults.point("gc:runs-tagged")
    for uri in rp.parts:
        root, _, leaf = uri.rpartition("/")
        get_artifact_repository(root).delete_artifacts(leaf)
    c.set_tag(rp.run_id, RUN_REMOVED_TAG, json.dumps(rp.parts))
    log.info("gc: MLflow run %s (%s, release %s): its %d bytes of artifacts deleted — %s", rp.run_id, rp.outcome or "?",
             rp.fingerprint, sum(rp.parts.values()), rp.why)  # fmt: skip


__all__ = [
    "ARCHIVED_TAG",
    "COMPACTED_REMOVED_TAG",
    "COMPACTED_TAG",
    "DEFAULT_POLICY",
    "REMOVED_TAG",
    "RUN_COLLECTING_TAG",
    "RUN_REMOVED_TAG",
    "RunPlan",
    "VersionPlan",
    "collect",
    "collect_compacted",
    "collect_run",
    "plan",
    "plan_compacted",
    "plan_runs",
]
