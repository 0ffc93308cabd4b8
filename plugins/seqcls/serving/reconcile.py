"""Reconcile: make every Triton endpoint serve exactly the recorded serving state. Idempotent.

Releases, rollbacks, ``seqcls sync``, a restarted Triton and crash recovery all end here, so
there is no separate undo logic to get wrong. From a :class:`~seqcls.serving.state.ServingState`:

- composing models (``<m>_tokenizer``, ``<m>_model``, ``<m>_postprocess``; names in
  :mod:`seqcls.contract.names`) load the served version, the candidate (a release in flight) and —
  when no candidate is in flight — the previous version, kept warm so a rollback is an ensemble
  switch; a version published with the *direct* pipeline is left out: its ``<m>`` runs the three
  steps itself, so loading them again would only hold a second copy of the model in memory;
- the public ensemble ``<m>`` loads exactly the served version (unpinned clients get it);
- the candidate route ``<m>_candidate`` loads exactly the candidate, or nothing.

Only the model's own five Triton models are read or touched: another model's release or
rollback on the same Triton never changes them.

Per endpoint, the ensembles in use are never left without their composing versions: composing
models first widen to desired ∪ what any endpoint's ensembles pin right now, then the ensembles
switch, then the composing models narrow to the desired set. An endpoint whose actual state
already equals the desired one is not touched. A route unloads only after the route that loads is
ready, and the routes are read back once at the end: Triton re-polls a loading ensemble's steps and
can load again a route unloaded meanwhile. Config files are shared by every endpoint, so
they are written once per phase; a dead endpoint is reported and the others still converge.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from seqcls import faults
from seqcls.contract.names import CLASSIC, ServingNames, require_name
from seqcls.errors import ServingError
from seqcls.serving.backend import StoreRepository
from seqcls.serving.client import TritonOps
from seqcls.serving.repository import Repository
from seqcls.serving.state import ServingState

log = logging.getLogger(__name__)
MAX_PARALLEL_LOADS = 8  # model loads in flight at once (3 composing models × replicas)


def desired_versions(
    state: ServingState, *, keep_previous: bool = True, direct: Collection[int] = ()
) -> dict[str, list[int]]:
    """Triton model → the versions that must be READY (empty = not loaded at all); ``direct``: versions
    of the direct pipeline (:meth:`Repository.direct_versions`), whose composing models are not loaded."""
    names = require_name(state.model_name).names
    composing = {state.serving, state.candidate}
    if keep_previous and state.candidate is None:
        composing.add(state.previous)
    composing.discard(None)
    composing -= set(direct)
    return {
        **{m: sorted(composing) for m in names.composing},  # type: ignore[type-var]
        names.ensemble: [state.serving] if state.serving is not None else [],
        names.candidate: [state.candidate] if state.candidate is not None else [],
    }


def observe(op: TritonOps, names: ServingNames) -> dict[str, list[int]]:
    """Triton model → READY versions of one seqcls model's five models on one endpoint (one call)."""
    out: dict[str, list[int]] = {m: [] for m in names.all}
    for m in op.repository_index():
        if m.get("name") in out and m.get("state") == "READY" and str(m.get("version", "")).isdigit():
            out[m["name"]].append(int(m["version"]))
    return {k: sorted(v) for k, v in out.items()}


@dataclass
class ReconcileReport:
    """What reconcile found and did, per endpoint; ``errors`` non-empty = not converged."""

    desired: dict[str, list[int]]
    actions: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    already: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def converged(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "desired": self.desired,
            "actions": self.actions,
            "errors": self.errors,
            "already": self.already,
            "seconds": round(self.seconds, 3),
            "converged": self.converged,
        }


class _Reconciler:
    def __init__(
        self,
        repo: Repository,
        ops: Sequence[TritonOps],
        desired: dict[str, list[int]],
        direct: Collection[int] = (),
        untouched: Collection[str] = (),
    ) -> None:
        self.repo, self.desired, self.names, self.direct = repo, desired, repo.names, set(direct)
        self.untouched = set(untouched)  # models left as the servers hold them (their config, too)
        self._lock = threading.Lock()
        self.report = ReconcileReport(desired)
        self.actual: dict[str, dict[str, list[int]]] = {}
        self.ops: list[TritonOps] = []
        for op in ops:
            try:
                op.require_live()
                self.actual[op.endpoint.grpc] = observe(op, self.names)
                self.ops.append(op)
            except Exception as exc:
                self.report.errors[op.endpoint.grpc] = f"not reachable: {exc}"

    @functools.cached_property
    def store(self) -> StoreRepository | None:
        """An ``s3://`` repository: the configs Triton reads are the store's (this directory is a working copy)."""
        return StoreRepository.at(self.repo.root)

    def pending(self) -> list[TritonOps]:
        todo = []
        for op in self.ops:
            seen = self.actual[op.endpoint.grpc]
            if {m: v for m, v in seen.items() if m not in self.untouched} == {
                m: v for m, v in self.desired.items() if m not in self.untouched
            }:
                self.report.already.append(op.endpoint.grpc)
            else:
                todo.append(op)
        return todo

    def write(self, model: str, versions: list[int]) -> None:
        """The shared config of ``model`` for ``versions`` (removed when empty)."""
        if model in self.untouched:
            return
        if not versions:
            self.repo.restore_config(model, None)
            if self.store is not None:
                self.store.drop_config(model)
            if model == self.names.candidate:
                self.repo.drop_candidate()
            return
        if model == self.names.candidate:
            self.repo.ensure_candidate_version(versions[0])
            if self.store is not None:
                self.store.ensure_version(model, versions[0], self.repo.root / model / str(versions[0]))
            text = self.repo.candidate_config(versions[0])
        else:
            base = versions[-1] if model != self.names.ensemble else versions[0]
            text = self.repo.config_for(model, base, versions)
        if self.store is not None:  # what Triton reads: the store's config, by compare-and-swap
            self.store.write_config(model, text)
        if self.repo.config_text(model) != text:
            self.repo.write_config(model, text)

    def apply(self, op: TritonOps, model: str, versions: list[int]) -> None:
        """Make ``model`` on ``op`` have exactly ``versions`` READY (load, or unload when empty)."""
        key = op.endpoint.grpc
        if key in self.report.errors or self.actual[key].get(model) == versions or model in self.untouched:
            return
        try:
            if versions:
                op.load(model)
                op.verify_ready(model, versions)
            elif op.ready(model):
                op.unload(model)
            self.actual[key][model] = list(versions)
            with self._lock:
                self.report.actions.append(f"{key}: {model} → {versions or 'unloaded'}")
        except ServingError as exc:
            with self._lock:
                self.report.errors.setdefault(key, str(exc))

    def apply_all(self, todo: Sequence[TritonOps], models: Sequence[str], versions: dict[str, list[int]]) -> None:
        """:meth:`apply` for every (endpoint, model) pair at once: models that do not pin each other
        (the three composing models; the two routes) load in parallel, on every replica in parallel —
        a load is mostly a python stub starting, so a reload costs one stub start, not six."""
        pairs = [(op, m) for op in todo for m in models]
        if len(pairs) <= 1:
            for op, m in pairs:
                self.apply(op, m, versions[m])
            return
        with ThreadPoolExecutor(max_workers=min(len(pairs), MAX_PARALLEL_LOADS)) as pool:
            for future in [pool.submit(self.apply, op, m, versions[m]) for op, m in pairs]:
                future.result()

    def run(self) -> ReconcileReport:
        todo = self.pending()
        if not todo:
            for model in self.names.all:  # servers agree; make sure the files say the same (a crash between)
                self.write(model, self.desired[model])
            return self.report
        routes, first = self.names.routes, self.names.tokenizer
        # what the routes serve right now pins its composing versions (a direct version pins none)
        in_use = {v for op in todo for r in routes for v in self.actual[op.endpoint.grpc][r]} - self.direct
        complete = set(self.repo.complete_versions())
        widened = sorted((set(self.desired[first]) | in_use) & complete)
        for phase, composing in (("widen", widened), ("narrow", self.desired[first])):
            for model in self.names.composing:
                self.write(model, composing)
            self.apply_all(todo, self.names.composing, dict.fromkeys(self.names.composing, composing))
            faults.point(f"reconcile:after-{phase}")
            if phase == "widen":
                for model in routes:
                    self.write(model, self.desired[model])
                self.switch_routes(todo)
                faults.point("reconcile:after-routes")
        self.settle_routes(todo)
        return self.report

    def switch_routes(self, todo: Sequence[TritonOps]) -> None:
        """The routes that load, then the routes that unload: Triton re-polls a loading ensemble's steps
        and loads again, from memory, a route unloaded meanwhile (seen with an S3 repository)."""
        routes = self.names.routes
        self.apply_all(todo, [r for r in routes if self.desired[r]], self.desired)
        self.apply_all(todo, [r for r in routes if not self.desired[r]], self.desired)

    def settle_routes(self, todo: Sequence[TritonOps]) -> None:
        """Read the routes back once: one that came back after its unload (or lost a version) is applied again."""
        for op in todo:
            key = op.endpoint.grpc
            if key in self.report.errors:
                continue
            try:
                seen = observe(op, self.names)
            except Exception as exc:
                self.report.errors[key] = f"not reachable: {exc}"
                continue
            for route in self.names.routes:
                if seen[route] != self.desired[route] and route not in self.untouched:
                    log.warning(
                        "reconcile %s: %s %s on %s after the switch, not %s — applying it again",
                        self.names.model_name,
                        route,
                        seen[route],
                        key,
                        self.desired[route] or "unloaded",
                    )
                    self.actual[key][route] = seen[route]
                    self.apply(op, route, self.desired[route])


def _served_missing(repo: Repository, state: ServingState, missing: list[int]) -> ServingError:
    legacy = repo.names != CLASSIC and set(missing) <= set(repo.for_model(CLASSIC.model_name).complete_versions())
    hint = (
        f" They exist under the classic names ({CLASSIC.ensemble}, {CLASSIC.tokenizer}, …): {state.model_name!r} "
        "was released before seqcls named Triton models per model; release it again (it gets its own names)."
        if legacy
        else ""
    )
    model = state.model_name
    return ServingError(
        f"{repo.root}: version {state.serving}, which the recorded state of {model!r} serves, is not complete in "
        f"the repository under its names ({', '.join(repo.names.models)}). Nothing was loaded or unloaded (a "
        f"running Triton keeps answering from memory; a restarted one cannot load it). `seqcls sync --model-name "
        f"{model}` restores a version from its release workspace where it can; otherwise serve the previous "
        f"version: `seqcls rollback --model-name {model}`.{hint}"
    )


def held_only(
    repo: Repository, state: ServingState, desired: dict[str, list[int]]
) -> tuple[dict[str, list[int]], set[str]]:
    """The versions to load while the served version exists only in Triton's memory (its directories gone,
    no verified copy left: publish let a new release proceed, saying so): the candidate loads beside it and
    the public route ``<m>`` is not touched (expose switches it); the served version is not asked of the
    composing models (a load cannot find it). Measured on Triton 2.x with the ensemble pipeline: loading the
    candidate's composing models makes Triton re-read the public ensemble, which then has no version left —
    the public route does not answer from reload until expose (seconds); the direct pipeline's public model
    is its own and keeps answering from memory."""
    log.warning(
        "reconcile %s: served version %s is not on disk (no verified copy); loading candidate %s beside what "
        "Triton holds in memory, the public route %s untouched",
        state.model_name,
        state.serving,
        state.candidate,
        repo.names.ensemble,
    )
    gone = {state.serving}
    return {m: [v for v in vs if v not in gone] for m, vs in desired.items()}, {repo.names.ensemble}


def reconcile(
    repo: Repository, state: ServingState, ops: Sequence[TritonOps], *, keep_previous: bool = True
) -> ReconcileReport:
    """Make every endpoint in ``ops`` serve ``state``; the caller holds ``repo.lock()``.

    The served version comes first: if it is not complete on disk nothing is touched (ServingError).
    A previous or candidate version that is not complete is left out — the rest converges — and
    reported in ``errors`` under ``repository``, naming it, so a deleted warm version never keeps the
    served one from loading (after a Triton restart, too).
    """
    t0 = time.perf_counter()
    repo = repo.for_model(state.model_name)
    direct = repo.direct_versions((state.serving, state.candidate, state.previous))
    desired = desired_versions(state, keep_previous=keep_previous, direct=direct)
    if (store := StoreRepository.at(repo.root)) is not None:  # a host that did not publish them: from the store
        store.fetch_missing(repo.names.models, sorted({v for vs in desired.values() for v in vs}))
    complete = set(repo.complete_versions())
    missing = sorted({v for vs in desired.values() for v in vs} - complete)
    untouched: set[str] = set()
    if state.serving in missing and (state.candidate is None or state.candidate in missing):
        raise _served_missing(repo, state, missing)
    if state.serving in missing:  # a release in flight beside a served version no copy of is left: see held_only
        desired, untouched = held_only(repo, state, desired)
    problems = {}
    for role, version in (("previous", state.previous), ("candidate", state.candidate)):
        if version in missing:
            problems[version] = (
                f"version {version} ({role} of {state.model_name!r}) is not complete in {repo.root} (pruned or "
                f"deleted); left unloaded, the served version {state.serving} converged. `seqcls sync --model-name "
                f"{state.model_name}` restores it from its release workspace where it can; the next release or "
                "rollback records a state without it."
            )
    desired = {m: [v for v in vs if v not in problems] for m, vs in desired.items()}
    report = _Reconciler(repo, ops, desired, direct, untouched).run()
    if problems:
        report.errors["repository"] = " ".join(problems.values())
    report.seconds = time.perf_counter() - t0
    log.info(
        "reconcile %s: serving %s, candidate %s, previous %s — %d action(s), %d endpoint(s) already there, "
        "%d error(s) in %.1fs",
        state.model_name,
        state.serving,
        state.candidate,
        state.previous,
        len(report.actions),
        len(report.already),
        len(report.errors),
        report.seconds,
    )
    return report
