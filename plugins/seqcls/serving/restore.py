"""Put a damaged or deleted published version back, byte-identically, from verified copies.

What the version must hold comes from its pin (:mod:`seqcls.serving.pins`: every ``release.json``,
kept outside the version directory), else — a version published before pins — from whatever
``release.json`` of it survives. Each missing or changed file is taken from a copy with the recorded
sha256, hashed again as it is written: the pin's own bytes (small files, ``release.json``), the release
workspace publish shipped from, the same version's other Triton models, other versions, the serving
code. A Triton model whose version directory is gone is assembled in a temporary directory and
renamed into place only when every file of it was found, so Triton never sees half a version. The
caller holds the repository lock (:meth:`Repository.lock`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.files import copy_hashed, replace_dir, replace_file
from seqcls.serving.pins import read_pin
from seqcls.serving.repository import RELEASE_FILE, Repository

log = logging.getLogger(__name__)

#: Where a whole Triton model version is assembled before its rename (as publish does; ``seqcls sync``
#: removes one whose pid is gone).
TMP_RESTORE = ".tmp-publish.{model}.{pid}-{version}"


@dataclass
class Wanted:
    """One file of the version to put back: where, its recorded hash, and (from the pin) its bytes."""

    target: Path
    digest: str
    data: bytes | None = None


@dataclass
class RestorePlan:
    """What ``version`` lacks, per Triton model, and a verified source for each file that has one."""

    version: int
    whole: dict[str, list[Wanted]] = field(default_factory=dict)  # model dirs that are gone
    files: dict[str, list[Wanted]] = field(default_factory=dict)  # missing/changed files of dirs still there
    sources: dict[str, Path] = field(default_factory=dict)  # sha256 → a file with those bytes
    unknown: list[str] = field(default_factory=list)  # Triton models whose content nothing records

    def has(self, w: Wanted) -> bool:
        """Whether a verified source of ``w``'s bytes is known (the pin's own, or a copy with its hash)."""
        return w.data is not None or w.digest in self.sources

    @property
    def missing(self) -> list[str]:
        """Files no verified copy exists for (and models nothing records): what cannot be restored."""
        lost = [str(w.target) for ws in (*self.whole.values(), *self.files.values()) for w in ws if not self.has(w)]
        return self.unknown + lost

    @property
    def needed(self) -> bool:
        return bool(self.whole or self.files or self.unknown)

    @property
    def complete(self) -> bool:
        return not self.missing


@dataclass
class Restored:
    version: int
    restored: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def _intact(path: Path, digest: str) -> bool:
    return path.is_file() and not path.is_symlink() and sha256_file(path) == digest


def _kept(kept: dict[str, bytes], rel: str, digest: str) -> bytes | None:
    """The pin's bytes of ``rel`` when it kept them and they have the recorded hash."""
    data = kept.get(rel)
    return data if data is not None and hashlib.sha256(data).hexdigest() == digest else None


def plan(repo: Repository, version: int, *, extra: Sequence[Path] = ()) -> RestorePlan:
    """What ``version`` lacks and where verified copies of it are (nothing is written); ``extra``: more
    directories that may hold copies (e.g. the MLflow model version's artifacts), searched last."""
    result = RestorePlan(version)
    pin = read_pin(repo.root, repo.model_name, version)
    workspaces: list[Path] = []
    for model in repo.names.models:
        vdir = repo.root / model / str(version)
        pinned = pin.models.get(model) if pin is not None else None
        if pinned is not None:
            files, kept, raw = pinned.files, pinned.kept, pinned.release_json
        else:  # before pins: only a surviving release.json says what the files are
            try:
                raw = None
                files, kept = json.loads((vdir / RELEASE_FILE).read_text(encoding="utf-8"))["files"], {}
            except (OSError, ValueError, KeyError, TypeError):
                result.unknown.append(f"{model}/{version} (no pin, no readable {RELEASE_FILE}: nothing records it)")
                continue
        info = repo.recorded(version, model) or {}
        if isinstance(info.get("workspace"), str):
            workspaces.append(Path(info["workspace"]))
        wanted = [
            Wanted(vdir / rel, digest, _kept(kept, rel, digest))
            for rel, digest in files.items()
            if not vdir.is_dir() or not _intact(vdir / rel, digest)
        ]
        if raw is not None and (not vdir.is_dir() or not (vdir / RELEASE_FILE).is_file()
                                or (vdir / RELEASE_FILE).read_bytes() != raw):  # fmt: skip
            wanted.append(Wanted(vdir / RELEASE_FILE, hashlib.sha256(raw).hexdigest(), raw))
        if wanted:
            (result.files if vdir.is_dir() else result.whole)[model] = wanted
    pending = {w.digest for ws in (*result.whole.values(), *result.files.values()) for w in ws if w.data is None}
    targets = {w.target for ws in (*result.whole.values(), *result.files.values()) for w in ws}
    for path in _copies(repo, version, workspaces, extra) if pending else ():
        if not pending:
            break
        if path in targets or not path.is_file() or path.is_symlink():
            continue
        digest = sha256_file(path)
        if digest in pending:
            result.sources[digest] = path
            pending.discard(digest)
    return result


def _copies(repo: Repository, version: int, workspaces: list[Path], extra: Sequence[Path] = ()) -> Iterator[Path]:
    """Where byte-identical copies of ``version``'s files may be: its release workspace (the snapshot and
    export publish shipped from), the same version's other Triton models, other versions, the serving code."""
    for ws in dict.fromkeys(workspaces):
        yield from sorted(ws.rglob("*")) if ws.is_dir() else ()
    for model in repo.names.models:
        yield from sorted((repo.root / model / str(version)).rglob("*"))
    for model in repo.names.models:
        for other in repo.versions(model):
            if other != version:
                yield from sorted((repo.root / model / str(other)).rglob("*"))
    yield from sorted(Path(repo.source).rglob("*"))
    for directory in extra:
        yield from sorted(Path(directory).rglob("*"))


def _write(w: Wanted, source: Path | None, target: Path) -> str:
    """``w``'s bytes (the pin's, or ``source``'s) into the new file ``target``, hashed as written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if w.data is not None:
        with open(target, "xb") as out:
            out.write(w.data)
        return hashlib.sha256(w.data).hexdigest()
    assert source is not None
    with open(source, "rb") as fin:
        digest, _ = copy_hashed(fin, target)
    return digest


def _origin(w: Wanted, source: Path | None) -> str:
    return "its pin" if w.data is not None else str(source)


def restore_version(repo: Repository, version: int) -> Restored:
    """Put back what ``version`` lacks where verified copies exist (see the module docstring); the caller
    holds the repository lock. Returns what was restored and what could not be."""
    p = plan(repo, version)
    done = Restored(version, missing=p.missing)
    if not p.needed:
        return done
    for model, wanted in p.whole.items():  # composing models first, the ensemble last (names.models order)
        if not all(p.has(w) for w in wanted):
            continue
        tmp_root = repo.root / TMP_RESTORE.format(model=repo.model_name, pid=os.getpid(), version=version)
        tmp = tmp_root / model / str(version)
        shutil.rmtree(tmp_root, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            vdir = repo.root / model / str(version)
            for w in wanted:
                source = p.sources.get(w.digest)
                if _write(w, source, tmp / w.target.relative_to(vdir)) != w.digest:
                    raise OSError(f"{source}: changed while it was copied")
            replace_dir(tmp, vdir)
            done.restored.append(f"{model}/{version}/ ({len(wanted)} files, from {_sources(wanted, p)})")
        except OSError as exc:
            log.warning("restore %s version %d: %s not restored (%s)", repo.model_name, version, model, exc)
            done.missing.append(f"{model}/{version} ({exc})")
        finally:
            shutil.rmtree(tmp_root, ignore_errors=True)
    for wanted in p.files.values():
        for w in wanted:
            if not p.has(w):
                continue
            source = p.sources.get(w.digest)
            tmp = w.target.with_name(f".tmp-restore-{os.getpid()}-{w.target.name}")
            try:
                tmp.unlink(missing_ok=True)
                if _write(w, source, tmp) == w.digest:
                    replace_file(tmp, w.target)
                    done.restored.append(f"{w.target.relative_to(repo.root)} (from {_origin(w, source)})")
            finally:
                tmp.unlink(missing_ok=True)
    if done.restored:
        log.warning("restored %s version %d: %s", repo.model_name, version, "; ".join(done.restored))
    return done


def _sources(wanted: list[Wanted], p: RestorePlan) -> str:
    origins = sorted({_origin(w, p.sources.get(w.digest)) for w in wanted})
    dirs = sorted({o if o == "its pin" else str(Path(o).parent) for o in origins})
    return ", ".join(dirs[:4]) + (" …" if len(dirs) > 4 else "")


__all__ = ["RestorePlan", "Restored", "plan", "restore_version"]
