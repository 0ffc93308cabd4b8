"""``seqcls sync``: make everything agree with the recorded serving state. Safe to run at any time.

What "recover" means after a crash, a Triton restart, an endpoint that missed a switch or an
MLflow outage, per model:

1. a candidate whose release is gone (its lease holder is dead or expired) is abandoned;
2. every endpoint is reconciled to the recorded state (load/unload, readiness per version);
3. the MLflow ``champion`` alias is moved to the registered version of the served fingerprint;
4. half-written publish/candidate directories left by a killed process are removed.

A live release in flight is left alone (its candidate stays); sync never changes *what* should
be served — that only releases and rollbacks do, under the lease.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seqcls.registry.ledger import mirror_champion
from seqcls.serving import control
from seqcls.serving.client import endpoints_from_settings
from seqcls.serving.lease import ReleaseLease, pid_alive
from seqcls.serving.names import CLASSIC
from seqcls.serving.release import served_release_key
from seqcls.serving.repository import Repository
from seqcls.serving.state import STATE_PREFIX, ServingState, current_state
from seqcls.settings import DEFAULT_MODEL_NAME, Settings

log = logging.getLogger(__name__)


def models_in(root: Path) -> list[str]:
    """Models with a recorded state in the repository, plus the default one if a legacy layout (no
    state file, the classic ensemble configured) serves it."""
    names = sorted(p.name[len(STATE_PREFIX) : -len(".json")] for p in Path(root).glob(f"{STATE_PREFIX}*.json"))
    if DEFAULT_MODEL_NAME not in names and Repository(Path(root), Path(root)).serving_version() is not None:
        names = sorted([*names, DEFAULT_MODEL_NAME])
    return names


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
        return {"error": f"MLflow: {str(exc)[:300]}"}


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
    return removed


def sync(settings: Settings, model_names: list[str] | None = None) -> list[SyncResult]:
    """Recover every (or the named) model of the repository; see the module docstring."""
    root = Path(str(settings.triton_repository))
    endpoints = endpoints_from_settings(settings)
    results = []
    for model in model_names or models_in(root):
        repo = Repository.from_settings(settings, model)
        abandoned = _abandon_orphan(repo, model, endpoints)
        state, report = control.reconcile_recorded(repo, model, endpoints)
        result = SyncResult(model, state.serving, state.candidate, abandoned, report.actions, report.errors)
        result.registry = _mirror(settings, state)
        result.removed = _clean(repo, set(state.live_versions()))
        log.info(
            "sync %s: serving %s on %d endpoint(s), %d action(s), %d error(s); registry %s",
            model,
            state.serving,
            len(endpoints),
            len(report.actions),
            len(report.errors),
            result.registry,
        )
        results.append(result)
    return results
