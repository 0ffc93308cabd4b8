"""``seqcls gc`` on an ``s3://`` repository: the version numbers the store holds that nothing needs.

Why gc and not publish: on a POSIX repository a publish prunes the version directories beyond ``retain``
(:func:`seqcls.steps.publish.prune`); on a store it prunes only this host's working copy, so every version
ever published stayed on the store — and Triton's S3 file system downloads a model's whole directory, every
version, on each load. A publish killed before its manifest (the completion marker, :mod:`seqcls.serving.s3repo`)
leaves objects that nothing serves either. gc collects, per version number N of the model's Triton models:

- *incomplete* (some part of N has no manifest): every object of N, once its newest object is older than
  ``gc_min_age`` on the store's clock (a publish in progress is never collected);
- *complete* N outside retention: the rule of a POSIX publish's prune — not among the newest ``retain``
  complete versions, not served, previous, candidate or a rollback target within ``retain`` in the recorded
  state (a working copy's pin does not keep it: prune drops the pin with the version, and so does gc);

and never a number any ``config.pbtxt`` on the store lists (so Triton has unloaded it, as on POSIX) nor one
above the recorded highest allocated number. Numbers are never reused without a tombstone: a publish
allocates above ``ServingState.published`` (recorded on the store by compare-and-swap before any object is
written), so every number gc can see is at most that, and gc refuses to touch one above it.

Crash-safe: a number's manifests go first (it is incomplete from then on: no config may list it), then its
other objects; a gc killed in between leaves an incomplete version the next gc collects.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from seqcls import faults
from seqcls.contract.names import ModelName
from seqcls.errors import InputError
from seqcls.ops.gcreport import STORE_INCOMPLETE, STORE_VERSION
from seqcls.serving.backend import StoreRepository
from seqcls.serving.pins import drop_pin
from seqcls.serving.s3lease import CONTROL
from seqcls.serving.s3repo import MANIFEST, served_versions
from seqcls.serving.servingstate import ServingState
from seqcls.settings import Settings

log = logging.getLogger(__name__)

#: The store's lease as gc holds it: renewed every third of this; a gc killed holds a model for at most this.
LEASE_TTL = 30.0


@dataclass
class StoreVersion:
    """One version number of a model on the store: its objects in every Triton model, and gc's decision."""

    version: int
    keys: list[str]
    complete: bool  # every Triton model of the ensemble has its manifest
    bytes: int = 0  # from the manifests (an incomplete part: unknown, counted 0)
    collect: bool = False
    reasons: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return STORE_VERSION if self.complete else STORE_INCOMPLETE

    def where(self, store: StoreRepository) -> str:
        """``s3://bucket/prefix/{tokenizer,…}/N/``: the Triton models holding objects of the number."""
        tritons = sorted({k.split("/", 1)[0] for k in self.keys})
        return store.repo.uri(f"{{{','.join(tritons)}}}/{self.version}/")


def store_of(settings: Settings) -> StoreRepository | None:
    """The store the settings' repository is a working copy of (None: a POSIX repository)."""
    return StoreRepository.at(Path(str(settings.triton_repository)))


def store_models(store: StoreRepository) -> set[ModelName]:
    """Models with control objects (state, lease, log) on the store: a host that never released knows them too."""
    names = set()
    for key in store.store.list(f"{CONTROL}/"):
        parts = key.split("/")
        if len(parts) >= 3:
            try:
                names.add(ModelName(parts[1]))
            except InputError:
                continue
    return names


def _age(store: StoreRepository, keys: list[str]) -> float:
    """Seconds since the newest of ``keys`` was written, on the store's clock: a publish writes each Triton model's
    objects in sorted order, so the newest is among each model's last key."""
    last = {k.split("/", 1)[0]: k for k in sorted(keys)}
    ages = []
    for key in last.values():
        stamped = store.store.read_stamped(key)
        if stamped.modified is None:
            return 0.0  # gone meanwhile: someone else is acting on it, not old
        now = stamped.store_time.timestamp() if stamped.store_time is not None else time.time()
        ages.append(now - stamped.modified.timestamp())
    return min(ages)


def plan(
    store: StoreRepository, model: ModelName, state: ServingState, retain: int, min_age: float
) -> list[StoreVersion]:
    """Every version number of ``model`` on the store, each collected or kept with why (see the module)."""
    names = model.names
    keys: dict[int, list[str]] = {}
    present: dict[int, set[str]] = {}  # the Triton models with any object of the number
    marked: dict[int, set[str]] = {}  # ... and those with its manifest
    for triton in names.all:
        for key in store.store.list(f"{triton}/"):
            parts = key.split("/")
            if len(parts) >= 3 and parts[1].isdigit():
                keys.setdefault(int(parts[1]), []).append(key)
                present.setdefault(int(parts[1]), set()).add(triton)
                if len(parts) == 3 and parts[2] == MANIFEST:
                    marked.setdefault(int(parts[1]), set()).add(triton)
    served: dict[int, list[str]] = {}
    for triton in names.all:
        got = store.repo.read_config(triton)
        if got is not None:
            for v in served_versions(got[0], triton):
                served.setdefault(v, []).append(triton)
    protected = state.protected_versions(depth=retain - 1)
    roles = {state.serving: "served", state.previous: "previous", state.candidate: "candidate"}
    out = [
        StoreVersion(v, sorted(k), marked.get(v, set()) >= set(names.models) | present[v])
        for v, k in sorted(keys.items())
    ]
    newest = {sv.version for sv in out if sv.complete}
    newest = set(sorted(newest)[-retain:])
    for sv in out:
        v, why = sv.version, sv.reasons
        if v in served:
            why.append(f"listed by {', '.join(served[v])}/config.pbtxt on the store (Triton may serve it)")
        if v in protected:
            role = roles.get(v)
            why.append(f"{role} version in the recorded state" if role else f"rollback target (retain {retain})")
        if v > state.published:
            why.append(f"above the recorded highest allocated number {state.published}: collecting it could let "
                       "the number be allocated again")  # fmt: skip
        if sv.complete:
            if v in newest:
                why.append(f"one of the newest {retain} complete versions (retain {retain})")
            if not why:
                sv.bytes = sum(m.size for t in names.models if (m := store.repo.manifest(t, v)) is not None)
        elif not why:
            age = _age(store, sv.keys)
            if age < min_age:
                why.append(f"incomplete, newest object {age:.0f}s old (< gc_min_age {min_age:.0f}s: a publish may "
                           "be writing it)")  # fmt: skip
        sv.collect = not why
    return out


def collect(
    store: StoreRepository, model: ModelName, sv: StoreVersion, root: Path, take: Callable[[Path], bool]
) -> None:
    """Remove version ``sv`` from the store: its manifests first, then its other objects; then this host's copy
    of it (moved aside with ``take``, else deleted) and its pin. The caller holds the model's lease."""
    manifests = [k for k in sv.keys if k.endswith(f"/{MANIFEST}")]
    for key in manifests:
        store.store.delete(key)
    faults.point("gc:store-markers-deleted")
    for key in sv.keys:
        if key not in manifests:
            store.store.delete(key)
            faults.point("gc:store-object-deleted")
    for triton in model.names.all:
        local = root / triton / str(sv.version)
        if local.is_dir() and not take(local):
            shutil.rmtree(local, ignore_errors=True)
    drop_pin(root, model, sv.version)
    log.info("gc: %s version %d of %s removed from %s (%d objects)", sv.kind, sv.version, model, store, len(sv.keys))


__all__ = ["LEASE_TTL", "StoreVersion", "collect", "plan", "store_models", "store_of"]
