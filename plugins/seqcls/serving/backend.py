"""The repository backend seam: what publish and reconcile do to the store when the repository is one.

A POSIX repository is one directory: a version renamed into place and a ``config.pbtxt`` replaced there
are what Triton reads. On an ``s3://`` repository the directory is this host's working copy
(:mod:`seqcls.serving.storeroot`) and Triton reads the store, so every such write has a store side,
done here: a version uploaded whole (objects, then its manifest: :mod:`seqcls.serving.s3repo`), a config
replaced by compare-and-swap and only over complete versions, a version of the store read back into the
working copy with every file's sha256 checked (a host that did not publish it: sync, the quality gate's
champion). The state and the lease hand over to the store in :mod:`seqcls.serving.state` and
:mod:`seqcls.serving.lease`, so the callers of those stay as they are.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from seqcls.errors import ServingError
from seqcls.files import atomic_write, replace_dir
from seqcls.serving.objectstore import ObjectStore
from seqcls.serving.s3repo import CONFIG, PublishedVersion, S3Repository
from seqcls.serving.storeroot import store_at

log = logging.getLogger(__name__)


@dataclass
class StoreRepository:
    """The store side of the working copy ``root``."""

    root: Path
    store: ObjectStore

    @classmethod
    def at(cls, root: Path) -> StoreRepository | None:
        """The store ``root`` is a working copy of, or None (a POSIX repository: nothing to do)."""
        store = store_at(root)
        return None if store is None else cls(Path(root), store)

    @property
    def repo(self) -> S3Repository:
        return S3Repository(self.store)

    def __str__(self) -> str:
        return str(self.store.location)

    def used_versions(self, models: Sequence[str]) -> set[int]:
        """Every version number with any object on the store, complete or not: none may be allocated again."""
        return {v for m in models for v in self.repo.versions(m).used}

    def complete(self, models: Sequence[str], version: int) -> bool:
        return all(version in self.repo.versions(m).complete for m in models)

    def publish(self, models: Sequence[str], version: int) -> list[PublishedVersion]:
        """Upload version ``version`` of ``models`` (in order: the ensemble last) from the working copy."""
        return [self.repo.publish_version(m, version, self.root / m / str(version)) for m in models]

    def ensure_version(self, model: str, version: int, local: Path) -> None:
        """Version ``version`` of ``model`` on the store, uploaded from ``local`` unless it is complete there."""
        if version not in self.repo.versions(model).complete:
            self.repo.publish_version(model, version, local)

    def write_config(self, model: str, text: str) -> None:
        """``model``'s config on the store (compare-and-swap over what was read; unchanged: not written). One
        GET: the read's stamp is what :meth:`S3Repository.write_config` waits out the config's second from."""
        current = self.repo.read_stamped_config(model)
        if current.data is not None and current.data.decode("utf-8") == text:
            return
        self.repo.write_config(model, text, current.etag, current)

    def drop_config(self, model: str) -> None:
        """Remove ``model``'s config from the store (Triton can no longer load it; its versions stay)."""
        key = f"{model}/{CONFIG}"
        if self.store.read(key) is not None:
            self.store.delete(key)

    def fetch_version(self, model: str, version: int) -> bool:
        """Version ``version`` of ``model`` read from the store into the working copy, each file's sha256
        checked against the version's manifest (False: not complete on the store). A local copy is replaced
        only whole (assembled aside, then renamed)."""
        manifest = self.repo.manifest(model, version)
        if manifest is None:
            return False
        target = self.root / model / str(version)
        tmp = self.root / model / f".tmp-fetch-{version}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            for rel, entry in sorted(manifest.files.items()):
                data = self.store.read_immutable(f"{model}/{version}/{rel}")
                digest = None if data is None else hashlib.sha256(data).hexdigest()
                if data is None or digest != entry.sha256:
                    raise ServingError(
                        f"{self.repo.uri(f'{model}/{version}/{rel}')}: "
                        f"{'missing' if data is None else f'sha256 {digest[:12]}'}, its manifest records "
                        f"{entry.sha256[:12]}: version {version} of {model!r} is damaged on {self}; "
                        "nothing was copied. Publish a new version."
                    )
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                atomic_write(tmp / rel, data)
            replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("read %s version %d from %s into %s (%d files, sha256 checked)", model, version, self, target,
                 len(manifest.files))  # fmt: skip
        return True

    def fetch_missing(self, models: Sequence[str], versions: Sequence[int]) -> list[tuple[str, int]]:
        """:meth:`fetch_version` for each of ``versions`` of ``models`` the working copy lacks."""
        fetched = []
        for version in versions:
            for model in models:
                if not (self.root / model / str(version)).is_dir() and self.fetch_version(model, version):
                    fetched.append((model, version))
        return fetched


__all__ = ["StoreRepository"]
