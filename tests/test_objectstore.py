"""The object-store building block (seqcls.serving.objectstore): ``s3://`` locations, the conditional-write
primitives a lease and a CAS-updated state will need, immutable objects checked by sha256, and the probe
that refuses a store ignoring ``If-None-Match`` / ``If-Match``.

Through a real S3 server (SeaweedFS 4.48's ``weed server`` on loopback, :mod:`tests.helpers.seaweedfs`):
round trips, two processes racing one create, a stale replace, the probe passing (measured: 4.48 answers
412 PreconditionFailed to both conditions). The refusal is tested with an in-memory client that ignores
the conditions, as some S3-compatible servers do. Nothing here is wired into publish, the lease or the
state yet.
"""

from __future__ import annotations

import hashlib
import io
import logging
import multiprocessing
import uuid
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from seqcls.errors import InputError, ServingError
from seqcls.serving.objectstore import (
    SHA256_META,
    ObjectConflict,
    ObjectIntegrityError,
    ObjectStore,
    S3Credentials,
    S3Location,
    probe,
)
from seqcls.settings import aws_s3_environment
from tests.helpers.seaweedfs import SeaweedFS, race_creates, seaweedfs

__all__ = ["seaweedfs"]  # the fixture, imported for this module's tests

SECRET = "wJalrXUtnFEMI-do-not-show"
KEY_ID = "AKIDONOTSHOW0001"


# --- locations and credentials (no server) ---------------------------------------------------------------


def test_a_location_parses_bucket_and_prefix_and_takes_explicit_values_over_the_environment() -> None:
    env = {"endpoint": "http://env:9000", "region": "eu-west-1", "access_key_id": "E", "secret_access_key": "S"}
    loc = S3Location.parse("s3://models/team/a/", endpoint="http://explicit:8333", environment=env)
    assert (loc.bucket, loc.prefix, loc.endpoint, loc.region) == (
        "models",
        "team/a/",
        "http://explicit:8333",
        "eu-west-1",
    )
    assert loc.credentials == S3Credentials("E", "S")
    assert loc.key("state.json") == "team/a/state.json"
    assert S3Location.parse("s3://models").prefix == ""
    for bad in ("models/x", "gs://b/x", "s3://", "s3:///x"):
        with pytest.raises(InputError, match="s3://bucket/prefix"):
            S3Location.parse(bad)


def test_the_standard_aws_variables_are_read_in_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://generic:1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:2")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    loc = S3Location.parse("s3://b/p", environment=aws_s3_environment())
    assert (loc.endpoint, loc.region) == ("http://s3-only:2", "us-west-2")
    assert loc.credentials == S3Credentials(KEY_ID, SECRET, None)


def test_credentials_never_appear_in_reprs_strings_logs_or_errors(caplog: pytest.LogCaptureFixture) -> None:
    loc = S3Location.parse("s3://b/p", endpoint="http://127.0.0.1:9", credentials=S3Credentials(KEY_ID, SECRET, "TOK"))
    store = ObjectStore(loc, client=IgnoringClient())
    texts = [repr(loc), str(loc), repr(store), repr(loc.credentials), f"{loc}", f"{store!r}"]
    with caplog.at_level(logging.DEBUG, logger="seqcls.serving.objectstore"), pytest.raises(InputError) as refused:
        probe(store)
    texts += [str(refused.value), caplog.text]
    unreachable = ObjectStore(S3Location.parse("s3://b/p", endpoint="http://127.0.0.1:9", credentials=loc.credentials))
    with pytest.raises(ServingError) as failed:
        unreachable.read("x")
    texts.append(str(failed.value))
    for text in texts:
        assert SECRET not in text and KEY_ID not in text and "TOK" not in text, text


# --- the refusal, with a store that ignores the conditions --------------------------------------------------


class IgnoringClient:
    """An in-memory S3 client that accepts ``IfNoneMatch`` / ``IfMatch`` and ignores them (what a store
    without conditional writes does): every put simply overwrites."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, dict[str, str]]] = {}

    def put_object(self, *, Bucket: str, Key: str, Body: bytes, Metadata: dict | None = None, **_: Any) -> dict:
        self.objects[Key] = (Body, dict(Metadata or {}))
        return {"ETag": f'"{hashlib.md5(Body).hexdigest()}"'}

    def get_object(self, *, Bucket: str, Key: str) -> dict:
        if Key not in self.objects:
            raise _ClientError("NoSuchKey", 404)
        body, meta = self.objects[Key]
        return {"Body": io.BytesIO(body), "ETag": f'"{hashlib.md5(body).hexdigest()}"', "Metadata": meta}

    def delete_object(self, *, Bucket: str, Key: str) -> dict:
        self.objects.pop(Key, None)
        return {}


class _ClientError(Exception):
    def __init__(self, code: str, status: int) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


def test_probe_refuses_a_store_that_ignores_conditional_writes() -> None:
    client = IgnoringClient()
    store = ObjectStore(S3Location.parse("s3://lax/repo", endpoint="http://lax.example:9000"), client=client)
    with pytest.raises(InputError) as refused:
        probe(store)
    message = str(refused.value)
    assert "s3://lax/repo/ at http://lax.example:9000 does not honour conditional writes" in message
    assert "If-None-Match: * succeeded" in message and "POSIX model repository" in message
    assert client.objects == {}, "the probe's scratch key was left behind"


def test_probe_refuses_a_store_that_honours_create_but_ignores_if_match() -> None:
    class CreateOnly(IgnoringClient):
        def put_object(self, *, Key: str, IfNoneMatch: str | None = None, **kw: Any) -> dict:
            if IfNoneMatch and Key in self.objects:
                raise _ClientError("PreconditionFailed", 412)
            return super().put_object(Key=Key, **kw)

    with pytest.raises(InputError, match="a replace with a stale If-Match ETag succeeded"):
        probe(ObjectStore(S3Location.parse("s3://half/repo"), client=CreateOnly()))


# --- a real S3 server ----------------------------------------------------------------------------------------


@pytest.fixture
def store(seaweedfs: SeaweedFS) -> ObjectStore:
    return seaweedfs.store(f"t-{uuid.uuid4().hex[:8]}")


@pytest.mark.integration
def test_round_trips_list_and_delete(store: ObjectStore) -> None:
    assert store.read("state.json") is None
    etag = store.create("state.json", b'{"v": 1}')
    assert store.read("state.json") == (b'{"v": 1}', etag)
    store.put_immutable("versions/3/model.onnx", b"weights")
    store.put_immutable("versions/3/manifest.json", b"{}")
    assert store.list() == ["state.json", "versions/3/manifest.json", "versions/3/model.onnx"]
    assert store.list("versions/") == ["versions/3/manifest.json", "versions/3/model.onnx"]
    store.delete("state.json")
    store.delete("state.json")  # already gone: no error
    assert store.read("state.json") is None


@pytest.mark.integration
def test_create_on_an_existing_key_and_a_stale_replace_lose(store: ObjectStore) -> None:
    first = store.create("lease", b"holder A token 1")
    with pytest.raises(ObjectConflict, match="creating 'lease' lost"):
        store.create("lease", b"holder B token 2")
    second = store.replace("lease", b"holder A token 3", first)
    assert second != first
    with pytest.raises(ObjectConflict, match="replacing 'lease' lost"):
        store.replace("lease", b"holder B token 4", first)  # B read before A's replace: stale
    assert store.read("lease") == (b"holder A token 3", second)
    with pytest.raises(ObjectConflict):
        store.replace("gone", b"x", second)  # If-Match on a key that does not exist


@pytest.mark.integration
def test_two_processes_racing_create_on_one_key_exactly_one_wins(seaweedfs: SeaweedFS) -> None:
    keys = [f"k-{uuid.uuid4().hex[:8]}-{i}" for i in range(20)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(2, mp_context=ctx) as pool:
        barrier = manager.Barrier(2)
        a = pool.submit(race_creates, seaweedfs, keys, barrier, "A")
        b = pool.submit(race_creates, seaweedfs, keys, barrier, "B")
        won_a, won_b = a.result(timeout=120), b.result(timeout=120)
    assert all(x != y for x, y in zip(won_a, won_b, strict=True)), list(zip(won_a, won_b, strict=True))
    store = seaweedfs.store("race")
    for key, a_won in zip(keys, won_a, strict=True):
        data, _ = store.read(key) or (b"", "")
        assert data == f"{'A' if a_won else 'B'} {key}".encode(), "the stored value is not the winner's"


@pytest.mark.integration
def test_probe_passes_on_seaweedfs_which_honours_both_conditions(store: ObjectStore) -> None:
    probe(store)
    assert store.list() == [], "the probe's scratch key was left behind"


@pytest.mark.integration
def test_immutable_objects_carry_their_sha256_and_a_mismatch_names_the_key(
    store: ObjectStore, seaweedfs: SeaweedFS
) -> None:
    data = b"onnx bytes"
    etag = store.put_immutable("v/1/model.onnx", data)
    assert store.put_immutable("v/1/model.onnx", data) == etag  # a retried publish of the same bytes
    with pytest.raises(ObjectConflict, match=r"'v/1/model\.onnx' already exists with other content"):
        store.put_immutable("v/1/model.onnx", b"other bytes")
    assert store.read_immutable("v/1/model.onnx") == data
    # the object replaced behind seqcls's back, its recorded hash kept (a tampered or truncated upload)
    raw = store._s3  # the real boto3 client
    key = store.location.key("v/1/model.onnx")
    raw.put_object(
        Bucket=store.location.bucket,
        Key=key,
        Body=b"onnx byt",
        Metadata={SHA256_META: hashlib.sha256(data).hexdigest()},
    )
    with pytest.raises(ObjectIntegrityError, match=r"'v/1/model.onnx' has sha256 [0-9a-f]{64}, recorded"):
        store.read_immutable("v/1/model.onnx")
    raw.put_object(Bucket=store.location.bucket, Key=store.location.key("v/1/plain"), Body=b"x")
    with pytest.raises(ObjectIntegrityError, match=r"'v/1/plain' has sha256 [0-9a-f]+, recorded nothing"):
        store.read_immutable("v/1/plain")
