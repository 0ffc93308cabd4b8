"""An ``s3://bucket/prefix`` object store with the compare-and-swap primitives a repository backend needs.

Why: on a POSIX repository the release lease and the recorded serving state are files guarded by
flock and atomic renames (:mod:`seqcls.serving.lease`, :mod:`seqcls.serving.state`). An object store
has neither; what it offers instead is the conditional write: ``If-None-Match: *`` creates a key only
if it does not exist, ``If-Match: <etag>`` replaces it only if nobody changed it since it was read.
Those two, honoured by the store, are enough for a lease and a CAS-updated state; a store that
silently ignores them would let two releases both "win", so :func:`probe` refuses such a store.

This module is the first building block only: publish, reload, the lease and the state do not use
it yet, and ``s3://`` repository values are still refused by :mod:`seqcls.settings`.

Credentials: taken as arguments (an Airflow Connection, resolved in ``seqcls.airflow``) or from the
standard AWS variables through :func:`seqcls.settings.aws_s3_environment`; they never appear in a
repr, a log line or an error message (a store is named by its ``s3://`` URI and endpoint only).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from seqcls.errors import InputError, ServingError

log = logging.getLogger(__name__)

#: The object metadata key (``x-amz-meta-sha256``) holding an immutable object's content hash.
SHA256_META = "sha256"
#: Where :func:`probe` writes its scratch objects, under the location's prefix.
PROBE_PREFIX = ".seqcls-probe/"
#: Error codes meaning "the condition did not hold": 412, or 409 when AWS sees two conditional
#: writes on one key at once (ConditionalRequestConflict; the loser retries after re-reading).
_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


class ObjectConflict(ServingError):
    """A conditional write lost: the key already exists (create) or changed since it was read (replace)."""


class ObjectIntegrityError(ServingError):
    """An immutable object's bytes do not hash to the sha256 recorded with it (or none was recorded)."""


@dataclass(frozen=True)
class S3Credentials:
    """An access key pair (and session token); the repr hides all of it, so a logged location leaks nothing."""

    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return "S3Credentials(<hidden>)"


@dataclass(frozen=True)
class S3Location:
    """Where a repository lives on an S3-API store: bucket, key prefix, endpoint, region, credentials.

    Why a value of its own: the same ``s3://`` string means different stores with different
    endpoints (AWS, MinIO, SeaweedFS), so the endpoint travels with it; credentials travel too but
    are excluded from the repr and from :meth:`__str__`.
    """

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str | None = None
    credentials: S3Credentials | None = field(default=None, repr=False)

    @classmethod
    def parse(
        cls,
        uri: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        credentials: S3Credentials | None = None,
        environment: Mapping[str, str | None] | None = None,
    ) -> S3Location:
        """``s3://bucket/prefix`` plus explicit values; what is not given comes from ``environment``
        (:func:`seqcls.settings.aws_s3_environment`'s mapping; None = nothing from the environment)."""
        scheme, sep, rest = uri.partition("://")
        bucket, _, prefix = rest.partition("/")
        if scheme != "s3" or not sep or not bucket:
            raise InputError(f"{uri!r} is not an object-store location: write s3://bucket/prefix")
        env = environment or {}
        if credentials is None and env.get("access_key_id") and env.get("secret_access_key"):
            credentials = S3Credentials(
                str(env["access_key_id"]), str(env["secret_access_key"]), env.get("session_token") or None
            )
        prefix = prefix.strip("/")
        return cls(
            bucket=bucket,
            prefix=f"{prefix}/" if prefix else "",
            endpoint=endpoint or env.get("endpoint") or None,
            region=region or env.get("region") or None,
            credentials=credentials,
        )

    def key(self, name: str) -> str:
        """The full object key of ``name`` (relative to the prefix)."""
        return f"{self.prefix}{name.lstrip('/')}"

    def __str__(self) -> str:
        where = f" at {self.endpoint}" if self.endpoint else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"


def _client(location: S3Location) -> Any:
    """A boto3 S3 client for ``location``: explicit credentials when given, else botocore's chain.

    Path-style addressing when an endpoint is given: MinIO and SeaweedFS on one host have no
    per-bucket DNS names.
    """
    import boto3
    from botocore.config import Config

    creds = location.credentials
    session = boto3.session.Session(
        aws_access_key_id=creds.access_key_id if creds else None,
        aws_secret_access_key=creds.secret_access_key if creds else None,
        aws_session_token=creds.session_token if creds else None,
        region_name=location.region or "us-east-1",
    )
    config = Config(
        retries={"mode": "standard", "max_attempts": 3},
        s3={"addressing_style": "path" if location.endpoint else "auto"},
    )
    return session.client("s3", endpoint_url=location.endpoint, config=config)


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code if code else status


def _status(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


@dataclass(frozen=True)
class Stamped:
    """One read with the store's own clock: a lease's age is measured there, not on a host's clock.

    ``modified`` is the object's ``Last-Modified``, ``store_time`` the response's ``Date`` (both whole
    seconds, HTTP dates); ``data``/``etag``/``modified`` are None when the key does not exist, and
    ``store_time`` is None only when the server sent no ``Date``.
    """

    data: bytes | None
    etag: str | None
    modified: datetime | None
    store_time: datetime | None


def _date(headers: Mapping[str, str], name: str) -> datetime | None:
    try:
        return parsedate_to_datetime(headers[name])
    except (KeyError, TypeError, ValueError, IndexError):
        return None


class ObjectStore:
    """The conditional-write primitives over one :class:`S3Location` (keys are relative to its prefix).

    A retried conditional write can report a conflict for its own first attempt (the response was
    lost, the retry finds the key written): callers of :meth:`create`/:meth:`replace` re-read
    after a conflict and decide from what is there, which is what a lease and a CAS loop do anyway.
    ETags are content hashes on most stores: a value written twice with the same bytes keeps its
    ETag, so what is CAS-replaced must carry something unique (a token, a sequence number).
    """

    def __init__(self, location: S3Location, client: Any = None) -> None:
        self.location = location
        self._s3 = client if client is not None else _client(location)

    def __repr__(self) -> str:
        return f"ObjectStore({self.location})"

    def _fail(self, what: str, key: str, exc: Exception) -> ServingError:
        return ServingError(f"{self.location}: {what} {key!r} failed ({_code(exc) or type(exc).__name__})")

    def read(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, or None when it does not exist."""
        got = self._get(key)
        return None if got is None else (got[0], got[1])

    def read_stamped(self, key: str) -> Stamped:
        """The object (or its absence) with the store's ``Last-Modified`` and ``Date`` (see :class:`Stamped`)."""
        try:
            response = self._s3.get_object(Bucket=self.location.bucket, Key=self.location.key(key))
        except Exception as exc:
            if _code(exc) in _MISSING_CODES or _status(exc) == "404":
                headers = (getattr(exc, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPHeaders", {})
                return Stamped(None, None, None, _date(headers, "date"))
            raise self._fail("reading", key, exc) from None
        headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        return Stamped(response["Body"].read(), response["ETag"], response.get("LastModified"), _date(headers, "date"))

    def _get(self, key: str) -> tuple[bytes, str, dict[str, str]] | None:
        try:
            response = self._s3.get_object(Bucket=self.location.bucket, Key=self.location.key(key))
        except Exception as exc:  # botocore's ClientError; its class lives on the client
            if _code(exc) in _MISSING_CODES or _status(exc) == "404":
                return None
            raise self._fail("reading", key, exc) from None
        return response["Body"].read(), response["ETag"], dict(response.get("Metadata") or {})

    def _put(self, key: str, data: bytes, what: str, **conditions: Any) -> str:
        try:
            response = self._s3.put_object(
                Bucket=self.location.bucket, Key=self.location.key(key), Body=data, **conditions
            )
        except Exception as exc:
            code = _code(exc)
            if code in _CONFLICT_CODES or _status(exc) in ("409", "412"):
                raise ObjectConflict(f"{self.location}: {what} {key!r} lost: {code}") from None
            if "IfMatch" in conditions and (code in _MISSING_CODES or _status(exc) == "404"):
                raise ObjectConflict(f"{self.location}: {what} {key!r} lost: it no longer exists") from None
            raise self._fail(what, key, exc) from None
        return str(response["ETag"])

    def create(self, key: str, data: bytes) -> str:
        """Write ``key`` only if it does not exist (``If-None-Match: *``); its ETag, or ObjectConflict."""
        return self._put(key, data, "creating", IfNoneMatch="*")

    def replace(self, key: str, data: bytes, etag: str) -> str:
        """Overwrite ``key`` only if its ETag is still ``etag`` (``If-Match``); the new ETag, or ObjectConflict."""
        return self._put(key, data, "replacing", IfMatch=etag)

    def put_immutable(self, key: str, data: bytes) -> str:
        """Write a published version's object once, with its sha256 as metadata; its ETag.

        Why create-only: a published version never changes. Writing the same bytes again (a retried
        publish) is accepted; different bytes under an existing key are an ObjectConflict.
        """
        digest = hashlib.sha256(data).hexdigest()
        try:
            return self._put(key, data, "writing", IfNoneMatch="*", Metadata={SHA256_META: digest})
        except ObjectConflict:
            existing = self._get(key)
            if existing is not None and existing[2].get(SHA256_META) == digest:
                return existing[1]
            raise ObjectConflict(f"{self.location}: {key!r} already exists with other content (immutable)") from None

    def read_immutable(self, key: str) -> bytes | None:
        """An object written by :meth:`put_immutable`, its bytes checked against the recorded sha256."""
        got = self._get(key)
        if got is None:
            return None
        data, _etag, meta = got
        recorded = meta.get(SHA256_META)
        actual = hashlib.sha256(data).hexdigest()
        if recorded != actual:
            raise ObjectIntegrityError(
                f"{self.location}: {key!r} has sha256 {actual}, recorded {recorded or 'nothing'}: "
                "the object was changed or truncated after it was published; republish the version"
            )
        return data

    def restore_immutable(self, key: str, data: bytes, etag: str) -> str:
        """Put a published object's recorded bytes back over other bytes found there (``If-Match`` on the ETag
        seen when they were found, so a concurrent repair is never overwritten), with their sha256; the new ETag."""
        return self._put(key, data, "restoring", IfMatch=etag, Metadata={SHA256_META: hashlib.sha256(data).hexdigest()})

    def etags(self, prefix: str = "") -> dict[str, str]:
        """Every key under ``prefix`` with its ETag (one listing: what changed since a check, without a read)."""
        found: dict[str, str] = {}
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.location.bucket, Prefix=self.location.key(prefix)
        )
        try:
            for page in pages:
                found |= {
                    o["Key"][len(self.location.prefix) :]: str(o.get("ETag", "")) for o in page.get("Contents", [])
                }
        except Exception as exc:
            raise self._fail("listing", prefix, exc) from None
        return found

    def list(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (relative to the location's prefix), sorted."""
        return sorted(self.etags(prefix))

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error when it is already gone: S3's DELETE is idempotent)."""
        try:
            self._s3.delete_object(Bucket=self.location.bucket, Key=self.location.key(key))
        except Exception as exc:
            raise self._fail("deleting", key, exc) from None


def _refuse(store: ObjectStore, what: str) -> InputError:
    return InputError(
        f"{store.location} does not honour conditional writes ({what}): the release lease and the "
        "recorded serving state need compare-and-swap there. Use a store that honours If-None-Match "
        "and If-Match on PUT (AWS S3, MinIO, SeaweedFS 4.48 were checked this way) or a POSIX model "
        "repository shared by the Triton replicas."
    )


def probe(store: ObjectStore) -> None:
    """Check on a scratch key that ``store`` really honours both conditions, else raise InputError.

    Why measure instead of trusting a name: some S3-compatible servers accept the headers and
    ignore them, which would let two releases both take the lease. The scratch key is removed.
    """
    key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        first = store.create(key, b"probe 1 " + key.encode())
        try:
            store.create(key, b"probe 2 " + key.encode())
        except ObjectConflict:
            pass
        else:
            raise _refuse(store, "a second create with If-None-Match: * succeeded")
        store.replace(key, b"probe 3 " + key.encode(), first)
        try:
            store.replace(key, b"probe 4 " + key.encode(), first)
        except ObjectConflict:
            pass
        else:
            raise _refuse(store, "a replace with a stale If-Match ETag succeeded")
    except ObjectConflict as exc:
        raise _refuse(store, f"a write whose condition held was refused: {exc}") from None
    except ServingError as exc:
        if "NotImplemented" in str(exc) or "501" in str(exc):
            raise _refuse(store, "the server answered NotImplemented") from None
        raise
    finally:
        try:
            store.delete(key)
        except ServingError as exc:
            log.warning("%s: could not remove the probe's scratch key %s: %s", store.location, key, exc)
    log.info("%s honours If-None-Match and If-Match on PUT", store.location)
