"""Triton model versions published to an ``s3://`` repository: objects first, the manifest last as the marker.

Why a marker: a POSIX publish assembles a version in a temporary directory and renames it into place, so
a server never sees half of it. An object store has no rename: a version's objects appear one by one, and
a publish killed half-way leaves some of them behind. So every object of version N of a Triton model is
written create-only with its sha256 (:meth:`ObjectStore.put_immutable`), and only then its manifest,
``<model>/<N>/.seqcls-manifest.json`` (every file's sha256 and size): a version is *complete* when its
manifest exists. A version without one is *incomplete* — a killed publish: no ``config.pbtxt`` may list
it (:meth:`S3Repository.write_config` refuses), so Triton never loads it, and gc may collect it.

The ``config.pbtxt`` of a model (its ``version_policy`` says which versions Triton serves) is the one
object that changes: it is written with compare-and-swap (``create`` the first time, ``replace`` with the
ETag read before), so of two writers who read the same config one wins and the other gets an
:class:`~seqcls.serving.objectstore.ObjectConflict`, and decides again from what is there now.

A version number is never reused: a version that has any object (marked or not) is refused, because a
Triton that loaded the old bytes under that number would keep serving them. Triton's S3 file system
downloads a model's whole directory, every version, on each load: versions nobody serves cost every load.

Not here yet: who allocates the number (the recorded serving state) and one writer at a time (the release
lease) on the store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls import faults
from seqcls.contract import shipped
from seqcls.errors import InputError, ServingError
from seqcls.serving.objectstore import ObjectConflict, ObjectStore, S3Location, Stamped
from seqcls.serving.repository import parse_config

log = logging.getLogger(__name__)

#: A version's completion marker, written last, inside the version (so one listing shows a version whole).
MANIFEST = ".seqcls-manifest.json"
CONFIG = "config.pbtxt"
SCHEMA = 1
RELEASE_FILE: str = shipped.contract().RELEASE_FILE
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ManifestFile:
    """One object of a version: the sha256 and size of the bytes that were uploaded."""

    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """What a complete version holds (file → sha256, size); its presence on the store is the marker."""

    model: str
    version: int
    files: dict[str, ManifestFile]
    published_at: str
    schema: int = SCHEMA

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1, sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        try:
            raw = json.loads(data)
            files = {str(k): ManifestFile(str(v["sha256"]), int(v["size"])) for k, v in raw["files"].items()}
            return cls(str(raw["model"]), int(raw["version"]), files, str(raw["published_at"]), int(raw["schema"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ServingError(f"{where} is not a seqcls version manifest ({exc!r}); republish the version") from None


@dataclass(frozen=True)
class PublishedVersion:
    """The result of one publish: what was written where, how much, how long."""

    model: str
    version: int
    objects: int
    bytes: int
    seconds: float
    manifest_key: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class VersionListing:
    """A model's versions on the store: complete (manifest present) and incomplete (objects, no manifest)."""

    model: str
    complete: tuple[int, ...]
    incomplete: tuple[int, ...]

    @property
    def used(self) -> tuple[int, ...]:
        """Every number that has an object: none of them may be published again."""
        return tuple(sorted({*self.complete, *self.incomplete}))


@dataclass(frozen=True)
class ConfigWrite:
    """A ``config.pbtxt`` written by compare-and-swap: the versions it serves and its new ETag."""

    model: str
    versions: tuple[int, ...]
    etag: str
    replaced_etag: str | None = None  # None: it was created


def _segment(value: str, what: str) -> str:
    if not isinstance(value, str) or not _SEGMENT_RE.match(value):
        raise InputError(f"{what} {value!r} is not one path segment of letters, digits, '_', '.', '-'")
    return value


def _version(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"Triton version {value!r} must be an integer >= 1")
    return value


def served_versions(text: str, model: str) -> tuple[int, ...]:
    """The versions a ``config.pbtxt`` serves; refused unless it names ``model`` and a ``specific`` policy.

    Why only ``specific``: ``latest`` or ``all`` would have Triton load whatever version directories the
    store lists, an incomplete one included.
    """
    config = parse_config(text, f"{model}/{CONFIG}")
    if config.name and config.name != model:
        raise InputError(f"{model}/{CONFIG}: its name is {config.name!r}, not {model!r}")
    if config.version_policy.WhichOneof("policy_choice") != "specific" or not config.version_policy.specific.versions:
        raise InputError(
            f"{model}/{CONFIG}: an object-store repository serves only listed versions: write "
            "version_policy: { specific: { versions: [ ... ] } } (latest/all would load incomplete versions)"
        )
    return tuple(sorted(set(config.version_policy.specific.versions)))


class S3Repository:
    """A Triton model repository on an object store (keys relative to the location's prefix)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"S3Repository({self.store.location})"

    @property
    def location(self) -> S3Location:
        return self.store.location

    def uri(self, key: str) -> str:
        """``s3://bucket/prefix/key``: how messages name one object (the endpoint is in the repository's str)."""
        return f"s3://{self.location.bucket}/{self.location.key(key)}"

    def versions(self, model: str) -> VersionListing:
        """Every version of ``model`` with any object, complete or not (one listing)."""
        model = _segment(model, "Triton model")
        seen: dict[int, bool] = {}
        for key in self.store.list(f"{model}/"):
            parts = key.split("/")
            if len(parts) >= 3 and parts[1].isdigit():
                version = int(parts[1])
                seen[version] = seen.get(version, False) or (len(parts) == 3 and parts[2] == MANIFEST)
        return VersionListing(
            model,
            tuple(sorted(v for v, marked in seen.items() if marked)),
            tuple(sorted(v for v, marked in seen.items() if not marked)),
        )

    def manifest(self, model: str, version: int) -> Manifest | None:
        """Version ``version``'s manifest (its sha256 checked), or None: the version is not complete."""
        key = f"{_segment(model, 'Triton model')}/{_version(version)}/{MANIFEST}"
        data = self.store.read_immutable(key)
        if data is None:
            return None
        manifest = Manifest.from_bytes(data, self.uri(key))
        if (manifest.model, manifest.version) != (model, version):
            raise ServingError(
                f"{self.uri(key)} describes {manifest.model!r} version {manifest.version}, "
                f"not {model!r} version {version}: the store was edited by hand; republish under a new version"
            )
        return manifest

    def publish_version(self, model: str, version: int, source: Path) -> PublishedVersion:
        """Upload the local version directory ``source`` (``<model>/<N>/`` as seqcls publishes it) as
        version ``version`` of ``model``: every file create-only with its sha256, then the manifest.

        Each file is read once; those bytes are hashed, checked against the hash its ``release.json``
        recorded, and uploaded. A failure leaves an incomplete version (no manifest), never a complete
        one with other bytes.
        """
        model, version, source = _segment(model, "Triton model"), _version(version), Path(source)
        started = time.monotonic()
        try:
            info = (source / RELEASE_FILE).read_bytes()
        except FileNotFoundError:
            raise InputError(f"{source / RELEASE_FILE} is missing: {source} is not a published version") from None
        recorded = _recorded_files(source, info)
        existing = self.store.list(f"{model}/{version}/")
        if existing:
            listing = self.versions(model)
            state = "complete" if version in listing.complete else "incomplete: no manifest, a publish that died"
            raise ServingError(
                f"{self.location}: version {version} of {model!r} already has {len(existing)} object(s) ({state}); "
                f"a version number is never reused (a Triton may hold its old bytes): publish as version "
                f"{max(listing.used) + 1}"
            )
        files: dict[str, ManifestFile] = {}
        for rel in sorted([*recorded, RELEASE_FILE]):
            data = info if rel == RELEASE_FILE else (source / rel).read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if rel in recorded and digest != recorded[rel]:
                raise ServingError(
                    f"{source / rel} has sha256 {digest[:12]}, its {RELEASE_FILE} recorded {recorded[rel][:12]}: "
                    f"the local version changed after it was verified; version {version} of {model!r} is left "
                    "incomplete on the store (no manifest: never served; gc may collect it). Publish it again."
                )
            self.store.put_immutable(f"{model}/{version}/{rel}", data)
            files[rel] = ManifestFile(digest, len(data))
        manifest = Manifest(model, version, files, datetime.now(UTC).isoformat(timespec="seconds"))
        faults.point("publish:before-store-marker")
        key = f"{model}/{version}/{MANIFEST}"
        self.store.put_immutable(key, manifest.to_bytes())
        result = PublishedVersion(
            model, version, len(files), manifest.size, round(time.monotonic() - started, 3), self.uri(key)
        )
        log.info(
            "published %s version %d to %s: %d objects, %d bytes in %.2f s (manifest last)",
            model,
            version,
            self.location,
            result.objects,
            result.bytes,
            result.seconds,
        )
        return result

    def read_config(self, model: str) -> tuple[str, str] | None:
        """``model``'s ``config.pbtxt`` and its ETag (what :meth:`write_config` swaps against), or None."""
        got = self.store.read(f"{_segment(model, 'Triton model')}/{CONFIG}")
        return None if got is None else (got[0].decode("utf-8"), got[1])

    def read_stamped_config(self, model: str) -> Stamped:
        """``model``'s ``config.pbtxt`` with its ETag and the store's clock (``data`` None: none exists). Why
        stamped: :meth:`write_config` given this read needs no second GET to wait out the config's second."""
        return self.store.read_stamped(f"{_segment(model, 'Triton model')}/{CONFIG}")

    def write_config(self, model: str, text: str, etag: str | None, read: Stamped | None = None) -> ConfigWrite:
        """Write ``model``'s ``config.pbtxt`` if it is still what was read (``etag``; None: it must not
        exist yet) and every version it serves is complete; ObjectConflict when another writer won.
        ``read``: the :meth:`read_stamped_config` that gave ``etag`` (else the config is read again for its stamp).
        """
        model = _segment(model, "Triton model")
        versions = served_versions(text, model)
        for version in versions:
            self._require_complete(model, version)
        key = f"{model}/{CONFIG}"
        if etag is not None:
            self._next_second(key, read if read is not None and read.etag == etag else None)
        try:
            if etag is None:
                new = self.store.create(key, text.encode("utf-8"))
            else:
                new = self.store.replace(key, text.encode("utf-8"), etag)
        except ObjectConflict:
            read = "none existed" if etag is None else f"it had ETag {etag}"
            raise ObjectConflict(
                f"{self.uri(key)} changed since it was read ({read}): another writer's config won; "
                f"versions {list(versions)} were not written. Read it again and decide from what it serves now"
            ) from None
        log.info("%s now serves versions %s (ETag %s)", self.uri(key), list(versions), new)
        return ConfigWrite(model, versions, new, etag)

    def _next_second(self, key: str, stamped: Stamped | None = None) -> None:
        """Wait until the store's clock has left the second of ``key``'s last write. Why: Triton decides whether
        a model changed from its files' modification times, and S3's ``Last-Modified`` has whole seconds — a
        config rewritten within the second of the previous one looks unchanged, and a reload keeps the old
        version policy (measured: 4 of 5 runs of a publish-then-flip test served the old version)."""
        stamped = stamped if stamped is not None else self.store.read_stamped(key)
        now, last = stamped.store_time, stamped.modified
        if now is not None and last is not None and int(now.timestamp()) <= int(last.timestamp()):
            time.sleep(1.0)

    def _require_complete(self, model: str, version: int) -> None:
        """Refuse a version without its marker, or whose manifest names an object the store lacks."""
        manifest = self.manifest(model, version)
        marker = self.uri(f"{model}/{version}/{MANIFEST}")
        if manifest is None:
            raise ServingError(
                f"{model}/{CONFIG} may not serve version {version}: its marker {marker} is missing "
                "(never published, or a publish that died before finishing); publish it whole first"
            )
        listed = set(self.store.list(f"{model}/{version}/"))
        missing = sorted(rel for rel in manifest.files if f"{model}/{version}/{rel}" not in listed)
        if missing:
            raise ServingError(
                f"{model}/{CONFIG} may not serve version {version}: {marker} lists {len(missing)} object(s) "
                f"the store lacks ({', '.join(missing[:5])}); the version is damaged, publish a new one"
            )


def _recorded_files(source: Path, info: bytes) -> dict[str, str]:
    """The files ``info`` (``source``'s ``release.json``) records (relative path → sha256), matched against
    the directory: nothing unrecorded is uploaded, nothing recorded is missing."""
    try:
        recorded = {str(k): str(v) for k, v in dict(json.loads(info)["files"]).items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{source / RELEASE_FILE} records no files ({exc!r}): {source} cannot be verified") from None
    present = {p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file() or p.is_symlink()}
    unrecorded = sorted(present - set(recorded) - {RELEASE_FILE})
    missing = sorted(set(recorded) - present)
    if unrecorded or missing:
        raise InputError(
            f"{source} differs from its {RELEASE_FILE}: unrecorded {unrecorded[:5]}, missing {missing[:5]}; "
            "publish a version exactly as it was verified"
        )
    return recorded


@dataclass(frozen=True)
class TritonS3:
    """How a Triton reads this repository: its ``--model-repository`` value and the process environment
    carrying the credentials (never on the command line; the repr hides the environment)."""

    uri: str
    environment: Mapping[str, str] = field(repr=False)


def triton_repository(location: S3Location) -> TritonS3:
    """``s3://host:port/bucket/prefix`` (Triton's form for a non-AWS endpoint; ``s3://https://…`` for TLS)
    or ``s3://bucket/prefix`` on AWS, and the ``AWS_*`` variables Triton's S3 file system reads."""
    path = f"{location.bucket}/{location.prefix}".rstrip("/")
    uri = f"s3://{path}"
    if location.endpoint:
        scheme, sep, rest = location.endpoint.partition("://")
        hostport = (rest if sep else scheme).rstrip("/")
        tls = sep and scheme == "https"
        if "/" in hostport or not hostport:
            raise InputError(f"S3 endpoint {location.endpoint!r}: Triton takes scheme://host:port, without a path")
        if not re.search(r":\d+$", hostport):
            hostport += ":443" if tls else ":80"
        uri = f"s3://{'https://' if tls else ''}{hostport}/{path}"
    env = {"AWS_DEFAULT_REGION": location.region or "us-east-1"}
    creds = location.credentials
    if creds is not None:
        env |= {"AWS_ACCESS_KEY_ID": creds.access_key_id, "AWS_SECRET_ACCESS_KEY": creds.secret_access_key}
        if creds.session_token:
            env["AWS_SESSION_TOKEN"] = creds.session_token
    return TritonS3(uri, env)


__all__ = [
    "MANIFEST",
    "ConfigWrite",
    "Manifest",
    "ManifestFile",
    "PublishedVersion",
    "S3Repository",
    "TritonS3",
    "VersionListing",
    "served_versions",
    "triton_repository",
]
