"""Are a published version's objects on an ``s3://`` repository still the bytes its manifest records?

Why a check of its own: on a POSIX repository the version directory *is* what Triton reads, and
:meth:`~seqcls.serving.repository.Repository.damaged_files` hashes it. On a store, Triton reads the
objects; this host's working copy may be intact while someone overwrote an object with ``aws s3 cp``
(or a lifecycle rule removed it). The next Triton that loads the version — a restart, a new pod — then
serves other bytes under the same version number. So ``seqcls status`` compares every object of the live
versions with the version's manifest (:mod:`seqcls.serving.s3repo`: sha256 per file), and ``seqcls sync``
puts the recorded bytes back from a verified copy on this host: the version's pin (small files), the
working copy, the release workspace — each hashed before it is written. A version is never published
again under its number; restoring its own bytes is not republishing.

Cost: one listing per Triton model version (with ETags) and the manifest; an object is read and hashed only
when its ETag differs from the one it had when this host last found it intact (``.seqcls-store-verified.json``
in the working copy). A changed object always gets a new ETag on S3 (a content hash, or a fresh value for a
multipart upload), so a hand edit is never hidden by the cache; bit rot inside the store is the store's
own business.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from seqcls.contract.names import ModelName
from seqcls.errors import ServingError
from seqcls.files import atomic_write
from seqcls.serving.objectstore import ObjectConflict, ObjectStore
from seqcls.serving.pins import read_pin
from seqcls.serving.repository import Repository
from seqcls.serving.s3lease import CONTROL
from seqcls.serving.s3repo import MANIFEST, S3Repository
from seqcls.serving.s3state import STATE

log = logging.getLogger(__name__)

#: In the working copy: key → [ETag, sha256] of the objects this host found intact.
VERIFIED = ".seqcls-store-verified.json"


@dataclass(frozen=True)
class ObjectDamage:
    """One object of a complete version that is missing from the store or holds other bytes."""

    uri: str
    key: str
    model: str
    version: int
    rel: str
    recorded: str  # the manifest's sha256
    found: str | None  # the object's sha256; None: missing
    etag: str | None  # the ETag it had when found (a restore replaces only that)

    def line(self) -> str:
        what = "is missing" if self.found is None else f"has sha256 {self.found[:12]}"
        return f"{self.uri} {what}, its manifest records sha256 {self.recorded[:12]}"


@dataclass
class VersionCheck:
    """What the store holds of one version of a model's Triton models, compared with their manifests."""

    version: int
    damaged: list[ObjectDamage] = field(default_factory=list)
    unmarked: list[str] = field(default_factory=list)  # Triton models with no (readable) manifest
    hashed: int = 0  # objects read and hashed (the rest: unchanged ETags)

    @property
    def intact(self) -> bool:
        return not self.damaged and not self.unmarked


def store_models(store: ObjectStore) -> list[str]:
    """Names of the models with a recorded state on the store (what a host with an empty working copy serves)."""
    names = set()
    for key in store.list(f"{CONTROL}/"):
        parts = key.split("/")
        if len(parts) == 3 and parts[2] == STATE:
            names.add(parts[1])
    return sorted(names)


def _load_verified(root: Path) -> dict[str, list[str]]:
    try:
        data = json.loads((root / VERIFIED).read_bytes())
        return {str(k): [str(v[0]), str(v[1])] for k, v in dict(data).items()}
    except (OSError, ValueError, TypeError, IndexError, KeyError):
        return {}  # nothing known: every object is read again


def _save_verified(root: Path, verified: dict[str, list[str]]) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(root / VERIFIED, json.dumps(verified, indent=0, sort_keys=True) + "\n")
    except OSError as exc:  # a cache only: the next check reads the objects again
        log.warning("%s not written (%s): the next check hashes every object again", root / VERIFIED, exc)


def check_version(store: ObjectStore, models: Sequence[str], version: int, root: Path) -> VersionCheck:
    """Every object ``version`` of ``models`` records, on the store, against its manifest (see the module doc)."""
    repo = S3Repository(store)
    verified = _load_verified(root)
    before = dict(verified)
    result = VersionCheck(version)
    for model in models:
        try:
            manifest = repo.manifest(model, version)
        except ServingError as exc:  # a manifest changed or unreadable: the version cannot be checked
            result.unmarked.append(f"{model}/{version}: {exc}")
            continue
        if manifest is None:
            result.unmarked.append(
                f"{model}/{version}: its marker {repo.uri(f'{model}/{version}/{MANIFEST}')} is missing"
            )
            continue
        listed = store.etags(f"{model}/{version}/")
        for rel, entry in sorted(manifest.files.items()):
            key = f"{model}/{version}/{rel}"
            etag = listed.get(key)
            if etag is not None and verified.get(key) == [etag, entry.sha256]:
                continue
            found = None
            if etag is not None:
                got = store.read(key)
                if got is not None:
                    data, etag = got
                    found = hashlib.sha256(data).hexdigest()
                    result.hashed += 1
            if found == entry.sha256:
                verified[key] = [str(etag), found]
                continue
            verified.pop(key, None)
            result.damaged.append(ObjectDamage(repo.uri(key), key, model, version, rel, entry.sha256, found, etag))
    if verified != before:
        _save_verified(root, verified)
    return result


def _workspace_files(repo: Repository, version: int) -> Iterator[Path]:
    """The files of ``version``'s release workspaces (the snapshot and export publish shipped from)."""
    seen = set()
    for model in repo.names.models:
        info = repo.recorded(version, model) or {}
        ws = info.get("workspace")
        if isinstance(ws, str) and ws not in seen and Path(ws).is_dir():
            seen.add(ws)
            yield from sorted(p for p in Path(ws).rglob("*") if p.is_file() and not p.is_symlink())


def verified_bytes(repo: Repository, damage: ObjectDamage) -> tuple[bytes, str] | None:
    """The recorded bytes of ``damage``'s object from a copy on this host (hash-checked) and where they came from:
    the version's pin, the working copy, the release workspace; None when no copy has the recorded sha256."""

    def ok(data: bytes) -> bool:
        return hashlib.sha256(data).hexdigest() == damage.recorded

    pin = read_pin(repo.root, repo.model_name, damage.version)
    kept = pin.models[damage.model].kept.get(damage.rel) if pin is not None and damage.model in pin.models else None
    if kept is not None and ok(kept):
        return kept, f"the pin of version {damage.version}"
    local = repo.root / damage.key
    if local.is_file() and not local.is_symlink() and ok(data := local.read_bytes()):
        return data, str(local)
    for path in _workspace_files(repo, damage.version):
        if path.name == Path(damage.rel).name and ok(data := path.read_bytes()):
            return data, str(path)
    for path in _workspace_files(repo, damage.version):  # renamed on export (e.g. the graph): any name
        if path.name != Path(damage.rel).name and ok(data := path.read_bytes()):
            return data, str(path)
    return None


def restore_objects(repo: Repository, store: ObjectStore, check: VersionCheck) -> tuple[list[str], list[str]]:
    """Put back every damaged object of ``check`` that has a verified copy here; (restored, not restored)."""
    restored, left = [], []
    for damage in check.damaged:
        source = verified_bytes(repo, damage)
        if source is None:
            left.append(f"{damage.line()}: no copy with that sha256 on this host")
            continue
        data, origin = source
        try:
            if damage.found is None:
                store.put_immutable(damage.key, data)
            else:
                store.restore_immutable(damage.key, data, str(damage.etag))
        except ObjectConflict as exc:  # changed again meanwhile (another repair?): the next check decides
            left.append(f"{damage.line()}: not restored, it changed meanwhile ({exc})")
            continue
        log.warning("restored %s on the store from %s (sha256 %s)", damage.uri, origin, damage.recorded[:12])
        restored.append(f"{damage.uri} on the store (from {origin})")
    return restored, left


def damage_problem(repo: Repository, role: str, check: VersionCheck, model_name: ModelName) -> str:
    """One sentence per damaged version: the objects, what a Triton loading it now would get, the fix."""
    lines = [d.line() for d in check.damaged] + check.unmarked
    shown = "; ".join(lines[:3]) + (f" (and {len(lines) - 3} more)" if len(lines) > 3 else "")
    fixable = not check.unmarked and all(verified_bytes(repo, d) is not None for d in check.damaged)
    fix = (
        f"`seqcls sync --model-name {model_name}` puts the recorded bytes back from this host's copies"
        if fixable
        else "no verified copy of every object is on this host: run `seqcls sync` where it was released, or "
        f"`seqcls rollback --model-name {model_name}` / release again (a new version number)"
    )
    return (
        f"{role} version {check.version} of {model_name!r} changed on the store after publish ({shown}): a Triton "
        f"that loads it now (a restart, a new replica) would not serve what was published; {fix}"
    )


__all__ = [
    "VERIFIED",
    "ObjectDamage",
    "VersionCheck",
    "check_version",
    "damage_problem",
    "restore_objects",
    "store_models",
    "verified_bytes",
]
