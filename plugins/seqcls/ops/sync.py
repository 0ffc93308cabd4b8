"""``seqcls sync``: make everything agree with the recorded serving state. Safe to run at any time.

What "recover" means after a crash, a Triton restart, an endpoint that missed a switch or an
MLflow outage, per model:

1. a candidate whose release is gone (its lease holder is dead or expired) is abandoned;
2. every endpoint is reconciled to the recorded state (load/unload, readiness per version);
3. a damaged state file is recorded again from its newest readable copy (``.bak`` or the log), a
   lost one from what the log or the configs say is served — only after that state converged;
4. the MLflow ``champion`` alias is moved to the registered version of the served fingerprint;
5. half-written publish/candidate directories left by a killed process are removed, and so is what a
   killed ``seqcls gc`` had already moved aside (:func:`seqcls.ops.gc.finish_leftovers`).

A live release in flight is left alone (its candidate stays); sync never changes *what* should
be served — that only releases and rollbacks do, under the lease. One model's damage (an
unreadable state or lease, a missing version) is reported for that model; the others converge.
A lost state that nothing reconstructs is never read as "serve nothing": sync then changes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import socket
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seqcls.contract.names import CLASSIC, DEFAULT_MODEL, ModelName
from seqcls.errors import SeqclsError, ServingError
from seqcls.ops.trash import finish_leftovers
from seqcls.registry import journal
from seqcls.registry.ledger import mirror_champion
from seqcls.release import control, verdicts
from seqcls.release.keys import served_release_key
from seqcls.release.workspace import Workspace
from seqcls.serving import restore, s3verify
from seqcls.serving.client import endpoints_from_settings
from seqcls.serving.lease import ReleaseLease
from seqcls.serving.pids import pid_alive
from seqcls.serving.pins import drop_pin
from seqcls.serving.repository import RELEASE_FILE, Repository
from seqcls.serving.state import (
    STATE_PREFIX,
    ServingState,
    current_state,
    restore_state,
    state_damaged,
    state_path,
    write_state,
)
from seqcls.serving.storeroot import store_at
from seqcls.settings import Settings

log = logging.getLogger(__name__)


def models_in(root: Path) -> list[ModelName]:
    """Models with a recorded state (or its log) in the repository, plus every model that has published
    versions — one whose state file was lost, and the default one in a legacy layout (no state file).

    Names found in file names are an edge: each is checked here (a file no model name fits is ignored)."""
    root = Path(root)
    names = {p.name[len(STATE_PREFIX) : -len(".json")] for p in root.glob(f"{STATE_PREFIX}*.json")}
    names |= {p.name[len(STATE_PREFIX) : -len(".log.jsonl")] for p in root.glob(f"{STATE_PREFIX}*.log.jsonl")}
    names |= set(_published_models(root))
    if (store := store_at(root)) is not None:  # a working copy: the store records them (a new host's copy is empty)
        names |= set(s3verify.store_models(store))
    if Repository(root, root).serving_version() is not None:
        names.add(DEFAULT_MODEL)
    return sorted(ModelName(n) for n in names if _valid(n))


def _valid(name: str) -> bool:
    try:
        ModelName(name)
    except SeqclsError:
        return False
    return True


def _published_models(root: Path) -> list[str]:
    """Model names whose ensemble directory holds a version published for that model (``release.json``)
    and a live config: what it serves, even when its state file is lost. (Versions without any config
    are a first release that never got as far as a candidate: nothing of it is served.)"""
    found = []
    for ensemble in root.iterdir() if root.is_dir() else ():
        if not (ensemble / "config.pbtxt").is_file():
            continue
        versions = sorted((int(p.name) for p in ensemble.glob("[0-9]*") if p.name.isdigit()), reverse=True)
        for version in versions[:1]:
            try:
                info = json.loads((ensemble / str(version) / RELEASE_FILE).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(info, dict) and info.get("model") == ensemble.name:
                name = info.get("model_name")
                found += [name] if isinstance(name, str) and name == ensemble.name else []
    return found


@dataclass
class SyncResult:
    model_name: str
    serving: int | None
    candidate: int | None
    abandoned: int | None = None
    actions: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    registry: dict[str, Any] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and "error" not in self.registry

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _abandon_orphan(repo: Repository, model: str, endpoints) -> int | None:
    """Drop a candidate nobody is releasing any more; returns its version (None: nothing abandoned)."""
    state = current_state(repo.root, model)
    if state.candidate is None:
        return None
    lease = ReleaseLease(repo.root, model)
    holder = lease.holder()
    if holder is not None and lease.dead_reason(holder) is None:
        log.info(
            "sync %s: candidate %s belongs to a live release (%s) — left alone",
            model,
            state.candidate,
            holder.describe(),
        )
        return None
    owner = f"sync:{socket.gethostname()}:{os.getpid()}"
    control.take_lease(repo.root, model, owner, "sync")
    try:
        note = f"abandoned by sync: its release is gone ({holder.describe() if holder else 'no lease holder'})"
        control.transition(repo, model, lambda s: s.without_candidate(owner, note), endpoints, live_first=False)
    finally:
        control.give_lease(repo.root, model, owner)
    log.warning("sync %s: %s", model, f"candidate {state.candidate} " + note)
    return state.candidate


def _mirror(settings: Settings, state: ServingState) -> dict[str, Any]:
    if state.serving is None:
        return {"skipped": "nothing is served"}
    key = served_release_key(Repository.from_settings(settings, state.model_name), state.serving)
    try:
        return mirror_champion(
            settings, state.model_name, state.fingerprint_of(state.serving), state.serving, release_key=key
        )
    except Exception as exc:  # MLflow down: serving is fixed anyway; the next sync mirrors
        return {"error": f"MLflow: {textwrap.shorten(str(exc), 300, placeholder=' …')}"}


#: ``publish.TMP_PUBLISH`` (``.tmp-publish.<model>.<pid>-<version>``), and the layout before per-model
#: names (``.tmp-publish-<pid>-<version>``, the default model's).
_TMP_PUBLISH = re.compile(r"\.tmp-publish\.(?P<model>.+)\.(?P<pid>\d+)-\d+")
_TMP_PUBLISH_LEGACY = re.compile(r"\.tmp-publish-(?P<pid>\d+)-\d+")


def _tmp_publish_pid(name: str, model_name: str) -> int | None:
    """The writer's pid if ``name`` is one of ``model_name``'s publish temporaries, else None."""
    m = _TMP_PUBLISH.fullmatch(name)
    if m and m["model"] == model_name:
        return int(m["pid"])
    m = _TMP_PUBLISH_LEGACY.fullmatch(name)
    return int(m["pid"]) if m and model_name == CLASSIC.model_name else None


def stale_temporaries(repo: Repository) -> list[Path]:
    """This model's half-written publish/candidate/config files whose writer is gone (a crash, kill -9)."""
    found = []
    for p in repo.root.glob(".tmp-publish*"):
        pid = _tmp_publish_pid(p.name, repo.model_name)
        if pid is not None and not pid_alive(pid):
            found.append(p)
    for p in repo.root.glob(f"{repo.names.candidate}/.tmp-*"):
        pid = next((int(x) for x in p.name.split("-") if x.isdigit()), None)
        if pid is None or not pid_alive(pid):
            found.append(p)
    for model in repo.names.all:
        found += [p for p in (repo.root / model).glob(".config.pbtxt.*.tmp") if not pid_alive(_pid_of(p.name))]
    return found


def _pid_of(name: str) -> int:
    digits = [x for x in name.split(".") if x.isdigit()]
    return int(digits[0]) if digits else 0


def incomplete_versions(repo: Repository, keep: set[int]) -> list[Path]:
    """Version directories of a publish that died between renames (present for some models only)."""
    complete = set(repo.complete_versions())
    found = []
    for model in repo.names.models:
        found += [repo.root / model / str(v) for v in repo.versions(model) if v not in complete and v not in keep]
    return found


def _clean(repo: Repository, keep: set[int]) -> list[str]:
    """Under the repository lock (a publish renames versions into place while holding it)."""
    removed = []
    with repo.lock(what="sync cleanup"):
        leftovers = stale_temporaries(repo) + incomplete_versions(repo, keep)
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        removed.append(str(path.relative_to(repo.root)))
    gone = {int(p.name) for p in leftovers if p.name.isdigit()} - set(repo.complete_versions()) - keep
    for version in sorted(v for v in gone if not any(v in repo.versions(m) for m in repo.names.models)):
        drop_pin(repo.root, repo.model_name, version)  # nothing of it is left to check or restore
    return removed


def _released_from(repo: Repository, version: int) -> tuple[str, str | None]:
    """The checkpoint ``version`` was released from and the eval set it was judged on (the file, or its kept
    copy when the file is gone), from its release workspace's manifest found through its pin or ``release.json``."""
    checkpoint, eval_set = "<its checkpoint>", None
    for model in repo.names.models:
        try:
            info = repo.recorded(version, model) or {}
            manifest = Workspace(Path(info["workspace"])).read()
            checkpoint = str(manifest["checkpoint"].get("source") or manifest["checkpoint"]["path"])
            configured = (manifest.get("config") or {}).get("eval_set")
            if configured:
                kept = ((manifest.get("eval_sets") or {}).get(configured) or {}).get("copy")
                eval_set = configured if Path(configured).is_file() or not kept else kept
            break
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return checkpoint, eval_set


def release_command(repo: Repository, version: int, *, override_reason: str | None = None) -> str:
    """The exact command that releases ``version``'s checkpoint again, as printed by status and sync, with the
    eval set it was judged on (a release without it would be refused); ``override_reason``: when it was judged on
    one, with ``--override quality`` and that reason (the gate of a release without one compares nothing)."""
    checkpoint, eval_set = _released_from(repo, version)
    with_eval = f" --eval-set {eval_set}" if eval_set else ""
    override = f" --override quality --reason {shlex.quote(override_reason)}" if override_reason and eval_set else ""
    return f"`seqcls release --checkpoint {checkpoint}{with_eval} --model-name {repo.model_name}{override}`"


def version_problems(repo: Repository, state: ServingState) -> list[str]:
    """The served, previous and candidate versions whose files are missing or changed, each with its fix."""
    problems = []
    roles = {state.serving: "served", state.previous: "previous", state.candidate: "candidate"}
    for version, role in sorted((v, r) for v, r in roles.items() if v is not None):
        missing = [f"{m}/{version}" for m in repo.names.models if version not in repo.versions(m)]
        changed = [p for p in repo.damaged_files(version) if not any(p.startswith(f"{d}/") for d in missing)]
        if not missing and not changed:
            continue
        what = "; ".join(([f"missing {', '.join(missing)}"] if missing else []) + changed[:3])
        if role != "candidate" and restore.plan(repo, version).complete:
            problems.append(
                f"{role} version {version} of {repo.model_name!r} is damaged ({what}): every file it lacks has a "
                f"verified copy (its pin, release workspace or other versions): `seqcls sync --model-name "
                f"{repo.model_name}` restores it byte-identically"
            )
            continue
        # the quality gate cannot re-score a served champion no copy is left of: the command carries the override
        reason = (
            f"served version {version} damaged, no verified copy left: released again" if role == "served" else None
        )
        command = release_command(repo, version, override_reason=reason)
        fix = {
            "served": f"Triton keeps what it loaded, but a restart cannot load it: release it again ({command}; "
            f"a new version number) or `seqcls rollback --model-name {repo.model_name}`",
            "previous": f"a rollback cannot use it: republish it with {command} (that serves it, as a new "
            "version), or leave it — the next release makes the served version the previous",
            "candidate": "its release cannot pass smoke; `seqcls sync` abandons it once that release is gone",
        }[role]
        problems.append(f"{role} version {version} of {repo.model_name!r} is damaged ({what}): {fix}")
    return problems


def _store_checks(repo: Repository, state: ServingState) -> list[tuple[str, s3verify.VersionCheck]]:
    """(role, check) of the served, previous and candidate versions' objects on the store; [] for POSIX."""
    store = store_at(repo.root)
    if store is None:
        return []
    roles = {state.serving: "served", state.previous: "previous", state.candidate: "candidate"}
    return [
        (role, s3verify.check_version(store, repo.names.models, version, repo.root))
        for version, role in sorted((v, r) for v, r in roles.items() if v is not None)
    ]


def store_problems(repo: Repository, state: ServingState) -> list[str]:
    """On an ``s3://`` repository: the live versions whose objects on the store changed after publish (what a
    Triton loading them now would get), each with its fix (:mod:`seqcls.serving.s3verify`)."""
    try:
        checks = _store_checks(repo, state)
    except ServingError as exc:  # the store unreachable: said, and the rest of the answer still given
        return [f"the objects of {repo.model_name!r} on the store were not checked: {exc}"]
    return [s3verify.damage_problem(repo, role, c, repo.model_name) for role, c in checks if not c.intact]


def _restore_store(repo: Repository, state: ServingState) -> list[str]:
    """Put the recorded bytes back over the live versions' objects changed on the store (before any reconcile:
    a Triton loading them then gets what was published)."""
    store, restored = store_at(repo.root), []
    for _role, check in _store_checks(repo, state) if store is not None else ():
        if check.damaged:
            done, left = s3verify.restore_objects(repo, store, check)
            restored += done
            for line in left:
                log.warning("sync %s: %s", repo.model_name, line)
    return restored


def verdict_problems(repo: Repository, state: ServingState) -> list[str]:
    """The served version, when it went live without passed-or-overridden verdicts — with its fix."""
    if state.serving is None:
        return []
    info = repo.recorded(state.serving, repo.names.ensemble)  # as published (its pin); unreadable: version_problems
    why = verdicts.unverified(info)
    if why is None:
        return []
    return [
        f"served version {state.serving} of {repo.model_name!r}: {why}. Release it through the gates "
        f"({release_command(repo, state.serving)}), or `seqcls rollback --model-name "
        f"{repo.model_name}` to the previous version"
    ]


def _sync_model(settings: Settings, model: str, endpoints) -> SyncResult:
    repo = Repository.from_settings(settings, model)
    damaged = state_damaged(repo.root, model)
    lost = not state_path(repo.root, model).exists()
    errors: dict[str, str] = {}
    undone = _undo_dead_registry(settings, repo, model)
    if "error" in undone:
        errors["journal"] = f"registry changes of a dead attempt not undone yet: {undone['error']}"
    abandoned = None
    try:
        abandoned = None if damaged else _abandon_orphan(repo, model, endpoints)
    except ServingError as exc:  # an unreadable lease: reported, the recorded state still converges
        errors["lease"] = str(exc)
    state = current_state(repo.root, model)  # a damaged file: its newest readable copy (or a clear error)
    if lost and state.serving is None and repo.complete_versions() and not _in_flight(repo, model):
        errors["state"] = (
            f"{state_path(repo.root, model)} is missing and neither its log nor the configs say which version "
            f"{model!r} serves (published: {repo.complete_versions()}); nothing was changed. Release the version "
            f"to serve: {release_command(repo, repo.complete_versions()[-1])}"
        )
        return SyncResult(model, None, None, errors=errors)
    restored = [f"restored {r}" for r in _restore_live(repo, state)]
    try:
        restored += [f"restored {r}" for r in _restore_store(repo, state)]
    except ServingError as exc:  # the store unreachable: said below by store_problems; serving still converges
        log.warning("sync %s: objects on the store not restored: %s", model, exc)
    errors.update({f"version {i + 1}": p for i, p in enumerate(version_problems(repo, state))})
    errors.update({f"store {i + 1}": p for i, p in enumerate(store_problems(repo, state))})
    try:
        state, report = control.reconcile_recorded(repo, model, endpoints)
    except ServingError as exc:  # e.g. a recorded version is missing: the problems above say what to do
        errors.setdefault("reconcile", str(exc))
        return SyncResult(model, state.serving, state.candidate, abandoned, restored, errors)
    result = SyncResult(model, state.serving, state.candidate, abandoned, report.actions, {**errors, **report.errors})
    result.actions[:0] = restored
    if report.converged and (damaged or (lost and state.serving is not None)):
        result.actions.append(_record_again(repo, model, state, damaged))
        if damaged and "lease" not in result.errors:
            result.abandoned = _abandon_orphan(repo, model, endpoints)
    result.errors.update({f"verdicts {i + 1}": p for i, p in enumerate(verdict_problems(repo, state))})
    result.registry = {**_mirror(settings, state), "journal": undone}
    result.removed = _clean(repo, set(state.live_versions()))  # an incomplete older version is no rollback target
    return result


def _restore_live(repo: Repository, state: ServingState) -> list[str]:
    """Restore the served, previous and candidate versions where byte-identical copies exist."""
    restored: list[str] = []
    damaged = [v for v in state.live_versions() if repo.problems(v)]
    if damaged:
        with repo.lock(what=f"sync restore {repo.model_name}"):
            for version in damaged:
                restored += restore.restore_version(repo, version).restored
    return restored


def _undo_dead_registry(settings: Settings, repo: Repository, model: str) -> dict[str, Any]:
    """Undo the MLflow changes journalled by dead attempts, under the model's lease: never while a live
    release holds it (an Airflow run between tasks is alive while its lease is)."""
    try:
        if _in_flight(repo, model):
            return {"skipped": "a live release holds the lease; its journal is its own"}
        owner = f"sync:{socket.gethostname()}:{os.getpid()}"
        control.take_lease(repo.root, model, owner, "sync")
    except ServingError as exc:  # an unreadable lease: reported by the lease check below
        return {"skipped": f"lease unreadable ({textwrap.shorten(str(exc), 200, placeholder=' …')})"}
    try:
        return journal.undo_dead_attempts(settings, model, reason="undone by seqcls sync")
    finally:
        control.give_lease(repo.root, model, owner)


def _in_flight(repo: Repository, model: str) -> bool:
    """A live release holds the lease (a first release between publish and its first state write)."""
    lease = ReleaseLease(repo.root, model)
    holder = lease.holder()
    return holder is not None and lease.dead_reason(holder) is None


def _record_again(repo: Repository, model: str, state: ServingState, damaged: str | None) -> str:
    """A converged copy (damaged file) or reconstruction (lost file) becomes the recorded state again."""
    if damaged:
        restore_state(repo.root, model)
        return f"state file was unreadable ({damaged[:120]}): recorded its newest readable copy again"
    write_state(repo.root, state, expected_generation=0)
    return f"state file was missing: recorded what is served again ({state.describe()})"


def operator_models(model_names: Sequence[str] | None) -> list[ModelName]:
    """The models an operator named (this library's edge for ``status``/``sync``/``history``): each checked,
    a bad one their error (InputError), not a model's; a ModelName passes unchanged."""
    return [ModelName(name) for name in model_names or ()]


def sync(settings: Settings, model_names: Sequence[str] | None = None) -> list[SyncResult]:
    """Recover every (or the named) model of the repository; see the module docstring."""
    root = Path(str(settings.triton_repository))
    endpoints = endpoints_from_settings(settings)
    results = []
    for model in operator_models(model_names) or models_in(root):
        try:
            result = _sync_model(settings, model, endpoints)
        except Exception as exc:  # one model's damage is its own: report it, converge the others
            log.warning("sync %s failed: %s", model, exc, exc_info=not isinstance(exc, SeqclsError))
            result = SyncResult(model, None, None, errors={"sync": f"{type(exc).__name__}: {exc}"[:1000]})
        log.info(
            "sync %s: serving %s on %d endpoint(s), %d action(s), %d error(s); registry %s",
            model,
            result.serving,
            len(endpoints),
            len(result.actions),
            len(result.errors),
            result.registry,
        )
        results.append(result)
    trash = finish_leftovers(settings)  # an interrupted gc's trash: nothing refers to it
    if trash:
        log.info("sync: removed what an interrupted gc had moved aside: %s", ", ".join(trash))
    return results
