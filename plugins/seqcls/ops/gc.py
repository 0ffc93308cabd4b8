"""``seqcls gc``: retention for what releases leave in the release home, so a scheduled release stays bounded.

Every release writes a workspace (``<home>/releases/<model>/<fp16>/``: the checkpoint snapshot, the static
export, the ONNX graphs, reports) and nothing removed them. gc keeps whole every workspace that serving,
rollback, restore or the quality gate's champion re-scoring may read — the served, previous and candidate
versions, the rollback targets within ``retain``, every version still published or pinned in the Triton
repository (``seqcls sync`` restores those from their workspace), the MLflow champion and previous champion,
a workspace written in the last ``gc_min_age`` seconds or locked by a step — and collects from the others
only their heavy artifacts (:data:`HEAVY`). Each release's small evidence stays: ``manifest.json`` (what ran,
every output's hash), the gate reports, ``evaluation.json``, the step records. The ``failed/`` leftovers are
kept for the newest ``gc_keep_refused`` refused attempts and collected for the rest; an eval-set copy (kept
once per home by content) is collected when no kept workspace of any model refers to it. An MLflow version is
kept exactly when its release workspace is kept whole (or an alias points to it); the others are archived
(their graphs deleted, the version kept with its tags and evidence), deleted, or left alone
(``gc_mlflow_versions``, :mod:`seqcls.registry.archive`). Releases older than the newest ``gc_evidence_keep``
and kept for none of those reasons lose their workspace too: its evidence compacted first into one audit record
(:mod:`seqcls.ops.evidence`), so a year of daily releases holds a bounded number of workspaces.

Safe under faults: gc holds each model's release lease (refused at once, naming the holder, while a release
holds it) and each workspace's lock while it moves things; what it collects is first renamed into
``<home>/.gc-trash/<pid>-<n>/`` (the same file system: one rename, never half a directory in a workspace), then
deleted. A gc killed midway leaves only trash that the next gc or ``seqcls sync`` deletes. Dry run by default.

On an ``s3://`` repository the same rules read the store (versions, configs, the recorded state) and gc also
collects the store's version numbers nothing needs — killed publishes' incomplete versions and complete ones
outside retention (:mod:`seqcls.ops.storegc`) — under the model's lease on the store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls import faults
from seqcls.contract.names import ModelName
from seqcls.errors import SeqclsError
from seqcls.files import atomic_write, held
from seqcls.ops import evidence, storegc
from seqcls.ops.disk import HEAVY, evalset_refs, megabytes, read_manifest, tree_bytes, workspaces
from seqcls.ops.gcargs import GC_HELP, add_arguments
from seqcls.ops.gcreport import (
    EVALSET,
    EVIDENCE,
    FAILED,
    KINDS,
    LEFTOVER,
    MLFLOW,
    STORE_INCOMPLETE,
    STORE_VERSION,
    WORKSPACE,
    GcResult,
    Item,
    ModelGc,
)
from seqcls.ops.history import rotate_log
from seqcls.ops.sync import models_in, operator_models
from seqcls.ops.trash import Trash, finish_leftovers, leftovers
from seqcls.registry import archive
from seqcls.registry.ledger import CHAMPION, FINGERPRINT_TAG, PREVIOUS, aliased_version, client
from seqcls.release import control
from seqcls.release.workspace import FAILED_DIR, MANIFEST, Release, Workspace, workspace_dir
from seqcls.serving.backend import StoreRepository
from seqcls.serving.lease import ReleaseLease
from seqcls.serving.pins import PIN_PREFIX
from seqcls.serving.repository import DEFAULT_RETAIN, Repository
from seqcls.serving.state import ServingState, current_state
from seqcls.settings import GC_MLFLOW_POLICIES, Settings

log = logging.getLogger(__name__)

#: Seconds the retention run after a promote may spend collecting (what is left waits for the next gc).
GC_BUDGET = 60.0

#: What the ``gc`` record in a collected workspace's manifest is called.
GC_RECORD = "gc"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------- what is kept, and why


def _refusal(manifest: dict[str, Any]) -> str | None:
    """When a gate refused this attempt: the finished_at of its failed gate step, else None."""
    for step in ("validate", "evaluate"):
        rec = (manifest.get("steps") or {}).get(step) or {}
        if rec.get("status") == "failed" and str(rec.get("error", "")).startswith("GateError"):
            return str(rec.get("finished_at") or manifest.get("updated_at") or "")
    return None


def _versions_of(repo: Repository, state: ServingState, on_store: set[int], dropped: set[int]) -> set[int]:
    """Every Triton version of the model the repository still holds or pins, and the state names. On an object
    store: ``on_store``, the complete versions it keeps, too, and never ``dropped``, the numbers gc collects
    from it (with this host's copy and pin)."""
    versions = {v for m in repo.names.models for v in repo.versions(m)} | on_store
    prefix = f"{PIN_PREFIX}{repo.model_name}.v"
    for pin in repo.root.glob(f"{prefix}*.json"):
        number = pin.name[len(prefix) : -len(".json")]
        if number.isdigit():
            versions.add(int(number))
    return (versions - dropped) | set(state.live_versions())


def _workspace_of(settings: Settings, repo: Repository, state: ServingState, version: int) -> set[Path]:
    """The workspace(s) ``version`` was published from: its ``release.json``/pin, and its state fingerprint."""
    found: set[Path] = set()
    for model in repo.names.models:
        info = repo.recorded(version, model) or {}
        if isinstance(info.get("workspace"), str):
            found.add(Path(info["workspace"]).resolve())
        if isinstance(info.get("fingerprint"), str):
            found.add(workspace_dir(settings, repo.model_name, info["fingerprint"]).resolve())
    fp = state.fingerprint_of(version)
    if fp:
        found.add(workspace_dir(settings, repo.model_name, fp).resolve())
    return found


def _registry_fingerprints(settings: Settings, model: str) -> dict[str, str]:
    """Fingerprint → why (MLflow champion / previous champion). MLflow unreadable: a RegistryError (gc then
    collects nothing of the model: it cannot tell what the quality gate re-scores)."""
    c = client(settings)
    out: dict[str, str] = {}
    for alias in (CHAMPION, PREVIOUS):
        mv = aliased_version(c, model, alias)
        fp = mv.tags.get(FINGERPRINT_TAG) if mv is not None else None
        if fp:
            out.setdefault(fp[:16], f"MLflow {alias} (v{mv.version})")
    return out


def _why_kept(
    settings: Settings, model: ModelName, retain: int, state: ServingState, on_store: list[storegc.StoreVersion]
) -> dict[Path, list[str]]:
    """Workspace → why it is kept whole (serving, rollback, restore and the champion need it)."""
    repo = Repository.from_settings(settings, model)
    kept_on_store = {sv.version for sv in on_store if sv.complete and not sv.collect}
    dropped = {sv.version for sv in on_store if sv.collect}
    why: dict[Path, list[str]] = {}

    def keep(paths: set[Path], reason: str) -> None:
        for p in paths:
            why.setdefault(p, []).append(reason)

    candidate = "candidate Triton v{} (a release in flight or awaiting approval)"
    roles = {state.serving: "served Triton v{}", state.previous: "previous Triton v{}", state.candidate: candidate}
    for version, role in roles.items():
        if version is not None:
            keep(_workspace_of(settings, repo, state, version), role.format(version))
    live = set(state.live_versions())
    for version in sorted(state.protected_versions(depth=retain - 1) - live):
        keep(_workspace_of(settings, repo, state, version), f"rollback target Triton v{version} (retain {retain})")
    for version in sorted(
        _versions_of(repo, state, kept_on_store, dropped) - state.protected_versions(depth=retain - 1)
    ):
        keep(_workspace_of(settings, repo, state, version), f"Triton v{version} published/pinned (sync restores it)")
    for fp16, reason in _registry_fingerprints(settings, model).items():
        keep({workspace_dir(settings, model, fp16).resolve()}, reason)
    return why


# ---------------------------------------------------------------------------- the plan


@dataclass
class _Plan:
    model: ModelGc
    moves: list[tuple[Path, list[Path]]] = field(default_factory=list)  # workspace → what to collect of it
    refs: set[str] = field(default_factory=set)  # eval-set copies the kept workspaces refer to
    versions: list[archive.VersionPlan] = field(default_factory=list)  # MLflow versions to archive/delete
    policy: str = archive.DEFAULT_POLICY
    compact: list[evidence.Planned] = field(default_factory=list)  # workspaces beyond the evidence horizon
    store: StoreRepository | None = None  # an s3:// repository: its versions below
    on_store: list[storegc.StoreVersion] = field(default_factory=list)


def _plan_model(
    settings: Settings,
    model: ModelName,
    keep_refused: int,
    retain: int,
    policy: str = archive.KEEP,
    evidence_keep: int | None = None,
) -> _Plan:
    plan = _Plan(ModelGc(str(model)), policy=policy)
    state = current_state(Path(str(settings.triton_repository)), model)  # read once (on a store: one GET)
    if (store := storegc.store_of(settings)) is not None:
        _plan_store(settings, model, plan, store, state, retain)
    kept = _why_kept(settings, model, retain, state, plan.on_store)
    now = time.time()
    refused: list[tuple[str, Path]] = []
    manifests: dict[Path, dict[str, Any] | None] = {}
    for ws in workspaces(settings, model):
        manifests[ws] = manifest = read_manifest(ws)
        if manifest and ws.resolve() not in kept:
            when = _refusal(manifest)
            if when is not None:
                refused.append((when, ws))
    newest_refused = {ws for _, ws in sorted(refused, reverse=True)[:keep_refused]}
    whole: set[Path] = set(newest_refused)  # workspaces nothing of whose evidence goes
    for ws, manifest in manifests.items():
        reasons = list(kept.get(ws.resolve(), []))
        try:
            age = now - (ws / MANIFEST).stat().st_mtime
        except OSError:
            age = now - ws.stat().st_mtime
        if age < settings.gc_min_age:
            reasons.append(f"written {age:.0f}s ago (< {settings.gc_min_age:.0f}s: a release may be between steps)")
        if manifest is None:
            reasons.append(f"{ws / MANIFEST} is unreadable: nothing of it is collected")
        if reasons:
            whole.add(ws)
            plan.model.items.append(Item(WORKSPACE, str(ws), tree_bytes(ws), False, reasons))
            plan.refs |= evalset_refs(manifest)
            continue
        heavy = [ws / name for name in HEAVY if (ws / name).exists()]
        if ws in newest_refused:
            plan.model.items.append(
                Item(FAILED, str(ws / FAILED_DIR), tree_bytes(ws / FAILED_DIR), False,
                     [f"one of the newest {keep_refused} refused attempts (refused {_refusal(manifest)})"])
            )  # fmt: skip
            plan.refs |= evalset_refs(manifest)
        elif (ws / FAILED_DIR).exists():
            failed = ws / FAILED_DIR
            plan.model.items.append(Item(FAILED, str(ws), tree_bytes(failed), True, parts=[FAILED_DIR]))
            heavy.append(failed)
        if any(p.name in HEAVY for p in heavy):
            names = [p.name for p in heavy if p.name in HEAVY]
            plan.model.items.append(Item(WORKSPACE, str(ws), sum(tree_bytes(ws / n) for n in names), True, parts=names))
        if heavy:
            plan.moves.append((ws, heavy))
    if policy != archive.KEEP:
        _plan_versions(settings, model, plan, policy)
    _plan_evidence(settings, model, plan, manifests, whole, evidence_keep)
    return plan


def _plan_store(
    settings: Settings, model: ModelName, plan: _Plan, store: StoreRepository, state: ServingState, retain: int
) -> None:
    """The store's version numbers of ``model``: collected or kept, with why (:mod:`.storegc`)."""
    plan.store = store
    plan.on_store = storegc.plan(store, model, state, retain, settings.gc_min_age)
    for sv in plan.on_store:
        path = sv.where(store)
        parts = [f"{len(sv.keys)} objects of version {sv.version}"] if sv.collect else []
        plan.model.items.append(Item(sv.kind, path, sv.bytes, sv.collect, list(sv.reasons), parts))


def _plan_evidence(settings: Settings, model: ModelName, plan: _Plan, manifests: dict[Path, dict[str, Any] | None],
                   whole: set[Path], keep: int | None) -> None:  # fmt: skip
    """Beyond the newest ``keep`` releases, what nothing else keeps is compacted; the records so far, said."""
    keep = settings.gc_evidence_keep if keep is None else keep
    plan.compact = evidence.plan(settings, model, manifests, whole, keep)
    for p in plan.compact:
        plan.model.items.append(Item(EVIDENCE, str(p.workspace), p.bytes, True, parts=p.parts(keep)))
    done = evidence.records(settings, model)
    if done:
        reason = f"{len(done)} compacted releases: one audit record each (manifest, hashes, verdicts, reports)"
        size = sum(tree_bytes(r) for r in done.values())
        plan.model.items.append(Item(EVIDENCE, str(evidence.audit_dir(settings, model)), size, False, [reason]))


def _plan_versions(settings: Settings, model: ModelName, plan: _Plan, policy: str) -> None:
    """The model's MLflow versions: kept while their workspace is kept whole (same reasons), else ``policy``."""
    kept_fps: dict[str, list[str]] = {}
    for item in plan.model.items:
        if item.kind == WORKSPACE and not item.collect:
            kept_fps.setdefault(Path(item.path).name, []).extend(item.reasons)
    plan.policy = policy
    for vp in archive.plan(client(settings), str(model), kept_fps, settings.gc_min_age):
        uri = f"models:/{model}/{vp.version}"
        if vp.collect:
            parts = [u.rsplit("/", 1)[-1] for u in vp.parts] + (["the version"] if policy == archive.DELETE else [])
            plan.model.items.append(Item(MLFLOW, uri, sum(vp.parts.values()), True, parts=parts))
            plan.versions.append(vp)
        else:
            plan.model.items.append(Item(MLFLOW, uri, 0, False, vp.reasons))


def _evalset_items(settings: Settings, refs: set[str]) -> list[Item]:
    directory = settings.eval_sets_dir
    items = []
    now = time.time()
    for copy in sorted(directory.iterdir()) if directory.is_dir() else ():
        if copy.name.startswith(".") or not copy.is_file():
            continue
        if copy.name in refs:
            items.append(Item(EVALSET, str(copy), tree_bytes(copy), False, ["referenced by a kept release workspace"]))
        elif now - copy.stat().st_mtime < settings.gc_min_age:
            items.append(Item(EVALSET, str(copy), tree_bytes(copy), False, ["kept less than gc_min_age ago"]))
        else:
            items.append(Item(EVALSET, str(copy), tree_bytes(copy), True))
    return items


# ---------------------------------------------------------------------------- crash-safe removal


def _collect_workspace(trash: Trash, ws: Path, paths: list[Path]) -> None:
    """Under the workspace's lock (a step writing it makes gc skip it): move ``paths`` aside, then record in
    the manifest what was collected (a later release of the same checkpoint redoes the steps whose outputs
    went: their recorded hashes no longer match)."""
    with held(ws / ".lock", timeout=0, what=f"gc of release {ws.name}", error=SeqclsError):
        moved = {}
        for p in paths:
            size = tree_bytes(p)
            if trash.take(p):
                moved[p.name] = size
                faults.point("gc:after-move")
        w = Workspace(ws)
        manifest = w.read()
        record = manifest.setdefault(GC_RECORD, {"collected": {}})
        record["collected"].update(moved)
        record["at"] = _now()
        mtime = w.manifest_path.stat().st_mtime  # gc's own note is not a release's write (gc_min_age reads it)
        atomic_write(w.manifest_path, json.dumps(manifest, indent=2, ensure_ascii=False, default=str))
        os.utime(w.manifest_path, (mtime, mtime))


@contextlib.contextmanager
def _model_lease(settings: Settings, model: str, owner: str | None) -> Iterator[None]:
    """The model's release lease, taken at once or refused naming its holder (LeaseError). On a store, held
    with a short ttl renewed meanwhile: a gc killed there blocks the model's releases for that ttl only."""
    lease = ReleaseLease(Path(str(settings.triton_repository)), model)
    me = owner or f"gc:{socket.gethostname()}:{os.getpid()}"
    if lease.store_lease is not None:
        with lease.hold(me, kind="process", step="gc", timeout=0, ttl=storegc.LEASE_TTL):
            yield
        return
    lease.acquire(me, kind="process", step="gc", timeout=0)
    try:
        yield
    finally:
        lease.release(me)


def gc_models(settings: Settings) -> list[ModelName]:
    """Models with a recorded state (on an object store: control objects there) or a directory of release
    workspaces."""
    names = set(models_in(Path(str(settings.triton_repository))))
    if (store := storegc.store_of(settings)) is not None:
        names |= storegc.store_models(store)
    root = settings.releases_dir
    for p in root.iterdir() if root.is_dir() else ():
        if p.is_dir() and not p.name.startswith("."):
            with contextlib.suppress(SeqclsError):
                names.add(ModelName(p.name))
    return sorted(names)


def gc(
    settings: Settings,
    model_names: Sequence[str] | None = None,
    *,
    apply: bool = False,
    keep_refused: int | None = None,
    retain: int = DEFAULT_RETAIN,
    budget: float | None = None,
    owner: str | None = None,
    mlflow_versions: str | None = None,
    evidence_keep: int | None = None,
    statelog_rotate_bytes: int | None = None,
) -> GcResult:
    """Plan (and with ``apply``, do) the collection for every (or the named) model; see the module docstring.

    ``budget``: seconds after which no further workspace is collected (what is left is said, for the next
    gc). ``owner``: the lease owner to take each model's lease as (default ``gc:<host>:<pid>``).
    ``mlflow_versions``: archive / delete / keep (default: the setting). ``evidence_keep``: the newest releases
    whose evidence stays as it is (default: the setting); older ones nothing else keeps are compacted. Likewise
    ``statelog_rotate_bytes``: a state log larger than this is rotated, with a snapshot."""
    t0 = time.perf_counter()
    keep_refused = settings.gc_keep_refused if keep_refused is None else keep_refused
    policy = settings.gc_mlflow_versions if mlflow_versions is None else str(mlflow_versions).strip().lower()
    if policy not in GC_MLFLOW_POLICIES:
        raise SeqclsError(f"gc: mlflow_versions must be one of {', '.join(GC_MLFLOW_POLICIES)}, got {policy!r}")
    if keep_refused < 0 or retain < 1 or (evidence_keep is not None and evidence_keep < 0):
        raise SeqclsError(f"gc: keep_refused must be ≥ 0 (got {keep_refused}) and retain ≥ 1 (got {retain})")
    rotate_at = settings.statelog_rotate_bytes if statelog_rotate_bytes is None else statelog_rotate_bytes
    if not isinstance(rotate_at, int) or rotate_at < 1:
        raise SeqclsError(f"gc: statelog_rotate_bytes must be a whole number of bytes ≥ 1, got {rotate_at!r}")
    result = GcResult(apply)
    all_models = gc_models(settings)
    models = operator_models(model_names) or all_models
    refs: set[str] = set()
    for other in set(all_models) - set(models):  # models gc leaves alone: every release of theirs counts as a reference
        for ws in workspaces(settings, other):
            refs |= evalset_refs(read_manifest(ws))
    result.home += [Item(LEFTOVER, str(p), tree_bytes(p), True) for p in leftovers(settings)]
    if apply:
        finish_leftovers(settings)
    trash = Trash(settings)
    for model in models:
        try:
            with _model_lease(settings, model, owner) if apply else contextlib.nullcontext():
                plan = _plan_model(settings, model, keep_refused, retain, policy, evidence_keep)
                refs |= plan.refs
                if apply:
                    _apply_store(settings, plan, trash, t0, budget)
                    _apply(plan, trash, t0, budget)
                    _apply_versions(settings, plan, t0, budget)
                    _apply_evidence(plan, trash, t0, budget)
                    rotate_log(Path(str(settings.triton_repository)), model, rotate_at)
                _compacted_versions(settings, plan, apply)
                _collected_runs(settings, plan, apply)
        except Exception as exc:  # one model's problem: reported, collects nothing of it; the others go on
            log.warning("gc %s: %s", model, exc, exc_info=not isinstance(exc, SeqclsError))
            error = str(exc) if isinstance(exc, SeqclsError) else f"{type(exc).__name__}: {exc}"
            result.models.append(ModelGc(str(model), error=error))
            for ws in workspaces(settings, model):  # nothing of it collected: all its eval sets stay referenced
                refs |= evalset_refs(read_manifest(ws))
            continue
        result.models.append(plan.model)
    evalsets = _evalset_items(settings, refs)
    if apply and (budget is None or time.perf_counter() - t0 < budget):
        for item in evalsets:
            if item.collect and not trash.take(Path(item.path)):
                item.collect, item.reasons = False, ["on another file system than the trash: left in place"]
    elif apply:
        for item in evalsets:
            item.collect, item.reasons = False, ["left for the next gc (time budget)"]
    result.home += evalsets
    if apply:
        trash.empty()
        freed = result.freed()
        log.info("gc: freed %s in %.1fs (%s)", megabytes(sum(freed.values())), time.perf_counter() - t0,
                 ", ".join(f"{k} {megabytes(n)}" for k, n in freed.items()))  # fmt: skip
    result.seconds = time.perf_counter() - t0
    return result


def _apply_store(settings: Settings, plan: _Plan, trash: Trash, t0: float, budget: float | None) -> None:
    """Remove the plan's store versions (before anything local: a store that stops answering fails the model
    here, having changed only whole versions' worth); past the budget, what is left is said."""
    if plan.store is None:
        return
    root, model = Path(str(settings.triton_repository)), ModelName(plan.model.model_name)
    by_path = {i.path: i for i in plan.model.items if i.kind in (STORE_VERSION, STORE_INCOMPLETE) and i.collect}
    for sv in plan.on_store:
        if not sv.collect:
            continue
        item = by_path[sv.where(plan.store)]
        if budget is not None and time.perf_counter() - t0 > budget:
            plan.model.deferred += 1
            item.collect, item.reasons = False, ["left for the next gc (time budget)"]
            continue
        storegc.collect(plan.store, model, sv, root, trash.take)


def _apply(plan: _Plan, trash: Trash, t0: float, budget: float | None) -> None:
    """Collect the plan's workspaces; one in use (a step holds its lock) or past the budget is kept, said so."""
    m = plan.model
    for ws, paths in plan.moves:
        items = [i for i in m.items if i.collect and i.path == str(ws)]
        if budget is not None and time.perf_counter() - t0 > budget:
            m.deferred += 1
            for i in items:
                i.collect, i.reasons = False, ["left for the next gc (time budget)"]
            continue
        try:
            _collect_workspace(trash, ws, paths)
        except SeqclsError as exc:  # a step holds the workspace lock: in use, kept
            for i in items:
                i.collect, i.reasons = False, [f"in use ({exc})"]
    m.applied = True


def _apply_versions(settings: Settings, plan: _Plan, t0: float, budget: float | None) -> None:
    """Archive (or delete) the plan's MLflow versions; one MLflow refuses, or past the budget, is kept, said so."""
    by_uri = {i.path: i for i in plan.model.items if i.kind == MLFLOW and i.collect}
    in_use = {Path(i.path).name: i.reasons for i in plan.model.items if i.kind == WORKSPACE and not i.collect}
    c = client(settings) if plan.versions else None
    for vp in plan.versions:
        item = by_uri[f"models:/{plan.model.model_name}/{vp.version}"]
        if vp.fingerprint in in_use:  # its workspace turned out in use (or deferred): the version waits with it
            item.collect, item.reasons = False, list(in_use[vp.fingerprint])
            continue
        if budget is not None and time.perf_counter() - t0 > budget:
            plan.model.deferred += 1
            item.collect, item.reasons = False, ["left for the next gc (time budget)"]
            continue
        try:
            archive.collect(c, plan.model.model_name, vp, plan.policy)
        except Exception as exc:  # MLflow refused this one: kept, said; the next gc finishes it
            log.warning("gc: MLflow v%s of %s not %sd: %s", vp.version, plan.model.model_name, plan.policy, exc)
            item.collect, item.reasons = False, [f"MLflow refused ({type(exc).__name__}: {exc}); the next gc retries"]


def _apply_evidence(plan: _Plan, trash: Trash, t0: float, budget: float | None) -> None:
    """Compact the plan's old releases; one whose heavy collection did not happen (in use, deferred), in use
    now, or past the budget stays whole, said so."""
    m = plan.model
    held = {i.path: i.reasons for i in m.items if i.kind in (WORKSPACE, FAILED) and not i.collect and i.reasons}
    for p in plan.compact:
        item = next(i for i in m.items if i.kind == EVIDENCE and i.path == str(p.workspace))
        if item.path in held:
            item.collect, item.reasons = False, list(held[item.path])
        elif budget is not None and time.perf_counter() - t0 > budget:
            m.deferred += 1
            item.collect, item.reasons = False, ["left for the next gc (time budget)"]
        else:
            try:
                evidence.compact(p.workspace, p.record, trash, m.model_name, p.bytes)
            except SeqclsError as exc:
                item.collect, item.reasons = False, [f"in use ({exc})"]


def _compacted(settings: Settings, model: str) -> set[str]:
    """The workspace names of ``model``'s releases whose audit record stands for a workspace that is gone."""
    releases = settings.releases_dir / model
    return {n for n in evidence.records(settings, model) if not (releases / n).is_dir()}


def _compacted_versions(settings: Settings, plan: _Plan, apply: bool) -> None:
    """Archived MLflow versions of compacted releases lose what is left of their files (:mod:`.archive`)."""
    model = plan.model.model_name
    fps = _compacted(settings, model)
    if plan.policy != archive.ARCHIVE or not fps:
        return
    c = client(settings)
    for vp in archive.plan_compacted(c, model, fps):
        why = "what is left of it (release compacted)" + ("; a gc was interrupted: finished now" * vp.unfinished)
        item = Item(MLFLOW, f"models:/{model}/{vp.version}", sum(vp.parts.values()), True, parts=[why])
        plan.model.items.append(item)
        try:
            if apply:
                archive.collect_compacted(c, model, vp)
        except Exception as exc:  # MLflow refused this one: kept, said; the next gc finishes it
            item.collect, item.reasons = False, [f"MLflow refused ({type(exc).__name__}: {exc}); the next gc retries"]


def _collected_runs(settings: Settings, plan: _Plan, apply: bool) -> None:
    """Runs no MLflow version names (refused attempts, re-runs of a registered release) lose their artifacts once
    their release is compacted or a newer re-run stands for it: else each adds its evidence for ever."""
    if plan.policy == archive.KEEP:
        return
    model = plan.model.model_name
    c = client(settings)
    for rp in archive.plan_runs(c, model, _compacted(settings, model), registered=plan.policy == archive.DELETE):
        why = rp.why + ("; a gc was interrupted: finished now" * rp.unfinished)
        item = Item(MLFLOW, f"runs:/{rp.run_id}", sum(rp.parts.values()), True, parts=[why])
        plan.model.items.append(item)
        try:
            if apply:
                archive.collect_run(c, rp)
        except Exception as exc:  # MLflow refused this one: kept, said; the next gc retries
            item.collect, item.reasons = False, [f"MLflow refused ({type(exc).__name__}: {exc}); the next gc retries"]


def after_promote(
    release: Release,
    *,
    keep_refused: int | None = None,
    mlflow_versions: str | None = None,
    budget: float = GC_BUDGET,
    evidence_keep: int | None = None,
    statelog_rotate_bytes: int | None = None,
) -> GcResult | None:
    """The model's retention right after its promote (``gc --apply``, as the release's lease owner, bounded by
    ``budget``; ``keep_refused`` and ``mlflow_versions``: the run's, else the settings): logged; a failure is a
    warning, never the release's (returns None then)."""
    model, owner = release.config.model_name, control.release_owner(release)
    try:
        done = gc(release.settings, [model], apply=True, keep_refused=keep_refused, mlflow_versions=mlflow_versions,
                  evidence_keep=evidence_keep, statelog_rotate_bytes=statelog_rotate_bytes, budget=budget,
                  owner=owner)  # fmt: skip
    except Exception as exc:
        log.warning("gc after promote of %s failed (the release is not affected): %s", model, exc)
        return None
    for m in done.models:
        if m.error:
            log.warning("gc after promote of %s: nothing collected — %s", m.model_name, m.error)
    freed = done.freed()
    kinds = ", ".join(f"{KINDS[k]} {megabytes(n)}" for k, n in freed.items() if n) or "nothing to collect"
    log.info(
        "gc after promote of %s: freed %s in %.1fs (%s)", model, megabytes(sum(freed.values())), done.seconds, kinds
    )
    return done


__all__ = ["GC_HELP", "KINDS", "GcResult", "Item", "ModelGc", "add_arguments", "after_promote", "gc"]
