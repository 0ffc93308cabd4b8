"""A fleet of real Tritons on one ``s3://`` model repository, through the real parts.

Three ``tritonserver`` processes (the nvidia-pytriton wheel's, explicit mode) read the same prefix of a
SeaweedFS store (the session fixture of :mod:`tests.helpers.seaweedfs`); releases go to all three. A fourth
replica started after the releases stands for a new pod: its probe runs ``seqcls replica-ready`` in a fresh
process with a fresh home (an empty working copy, as on a new pod) and only the ``s3://`` setting, and must
say NOT ready until ``--reconcile`` made it serve the recorded version. Then a rollback across the fleet, a
restarted replica reconciled by its probe, and the drill of an object changed on the store after publish:
``seqcls status`` names it, ``seqcls sync`` puts its published bytes back.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from seqcls.localtriton import LocalTriton
from seqcls.ops.status import status
from seqcls.ops.sync import sync
from seqcls.release.intake import open_release
from seqcls.serving.client import Endpoint, TritonOps
from seqcls.serving.objectstore import ObjectConflict, ObjectStore, S3Location
from seqcls.serving.reconcile import observe
from seqcls.serving.s3repo import S3Repository, served_versions, triton_repository
from seqcls.serving.s3state import S3ServingState
from seqcls.serving.s3verify import check_version
from seqcls.settings import PROJECT_ROOT, Settings
from seqcls.steps import run_release
from seqcls.steps.rollback import rollback_model
from tests.helpers.seaweedfs import SeaweedFS, seaweedfs
from tests.helpers.triton import start_triton

__all__ = ["seaweedfs"]  # the fixture, imported for this module's tests

pytestmark = [pytest.mark.slow, pytest.mark.integration]

MODEL = ModelName("seqcls")
TEXTS = ["the same text on every replica", "一段固定的测试文本", "x"]


@dataclass
class Fleet:
    """The store, the three replicas on it, and what a release host and a new pod are given."""

    root: Path
    uri: str
    location: S3Location
    key: str
    servers: list[LocalTriton]
    env: dict[str, str] = field(repr=False)  # the AWS variables that reach the store (a pod has them too)

    def settings(self, servers: Sequence[LocalTriton], home: Path | None = None) -> Settings:
        return Settings(
            home=home or self.root / "release-home",
            triton_repository=self.uri,
            triton_grpc=tuple(s.config.grpc_url for s in servers),
            triton_http=tuple(s.config.http_url for s in servers),
            triton_control_key=self.key,
        )

    def start(self, name: str) -> LocalTriton:
        """One more replica on the same store, started now (explicit mode: it loads nothing by itself)."""
        triton = triton_repository(self.location)
        return start_triton(
            self.root, name, repository=triton.uri, control_key=self.key, environment=triton.environment
        )

    @property
    def store(self) -> ObjectStore:
        return ObjectStore(self.location)


@pytest.fixture(scope="module")
def fleet(seaweedfs: SeaweedFS, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Three real Tritons on a fresh prefix of the store, started once for the module."""
    root = tmp_path_factory.mktemp("s3fleet")
    prefix = f"fleet-{uuid.uuid4().hex[:8]}"
    env = {
        "AWS_ENDPOINT_URL_S3": seaweedfs.endpoint,
        "AWS_ACCESS_KEY_ID": seaweedfs.credentials.access_key_id,
        "AWS_SECRET_ACCESS_KEY": seaweedfs.credentials.secret_access_key,
        "AWS_REGION": "us-east-1",
    }
    location = seaweedfs.location(prefix)
    # tritonserver 2.51 refuses to start on a prefix with no object ("not a valid directory")
    ObjectStore(location).put_immutable("README.txt", b"a seqcls model repository\n")
    servers: list[LocalTriton] = []
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        try:
            f = Fleet(root, f"s3://{seaweedfs.bucket}/{prefix}", location, secrets.token_urlsafe(32), servers, env)
            for i in range(3):
                servers.append(f.start(f"triton-{i}"))
            yield f
        finally:
            for server in servers:
                server.stop()


@pytest.fixture(scope="module")
def released(fleet: Fleet, tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path) -> Fleet:
    """Two releases onto the store, reconciled on all three replicas: v2 served, v1 the previous."""
    settings = fleet.settings(fleet.servers)
    for i, src in enumerate((tiny_checkpoint_src, tiny_checkpoint_b_src)):
        ckpt = shutil.copytree(src, fleet.root / f"ckpt-{i}")
        results = {r.step: r for r in run_release(open_release(ckpt, settings=settings))}
        assert results["promote"].status == "ok", results
    assert _recorded(fleet) == (2, (2,))
    return fleet


def _recorded(fleet: Fleet) -> tuple[int | None, tuple[int, ...]]:
    """(recorded serving version on the store, versions the store's ensemble config serves)."""
    state = S3ServingState(fleet.store, MODEL).read().state
    config = S3Repository(fleet.store).read_config(MODEL.names.ensemble)
    return state.serving, served_versions(config[0], MODEL.names.ensemble) if config else ()


def _answers(server: LocalTriton, version: int) -> list:
    """The public route's answer to :data:`TEXTS`, pinned to ``version`` (probabilities rounded to 1e-6)."""
    preds, probs = TritonOps(Endpoint(server.config.grpc_url)).infer(TEXTS, model=MODEL.names.ensemble, version=version)
    return [preds, [[round(float(p), 6) for p in row] for row in probs]]


def _ready_versions(fleet: Fleet, server: LocalTriton, model: str) -> list[int]:
    """The READY versions of ``model`` on ``server`` (its repository index: the control key's)."""
    return observe(TritonOps(Endpoint(server.config.grpc_url, control_key=fleet.key)), MODEL.names)[model]


def _probe(fleet: Fleet, server: LocalTriton, home: Path, *args: str) -> tuple[int, dict]:
    """``seqcls replica-ready`` as a pod's probe runs it: a fresh process, its own home, the ``s3://`` setting."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SEQCLS_", "AWS_"))},
        **fleet.env,
        "PYTHONPATH": os.pathsep.join(str(PROJECT_ROOT / p) for p in ("plugins", "tools", ".")),
        "SEQCLS_HOME": str(home),
        "SEQCLS_TRITON_REPOSITORY": fleet.uri,
        "SEQCLS_TRITON_CONTROL_KEY": fleet.key,
    }
    argv = [sys.executable, "-m", "seqcls.cli", "replica-ready", "--url", server.config.grpc_url, "--json", *args]
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    answer = json.loads(out.stdout)
    print(f"replica-ready {' '.join(args)}: exit {out.returncode} in {time.perf_counter() - t0:.2f}s wall "
          f"(check {answer['seconds']:.2f}s)")  # fmt: skip
    return out.returncode, answer


def test_a_replica_started_after_a_release_is_ready_only_once_it_serves_the_recorded_version(
    released: Fleet,
) -> None:
    fleet = released
    first, *_ = fleet.servers
    want = _answers(first, 2)
    assert all(_answers(s, 2) == want for s in fleet.servers)

    late = fleet.start("triton-late")  # a new pod: its Triton reads the store, its home is empty
    try:
        pod_home = fleet.root / "pod-home"
        code, fresh = _probe(fleet, late, pod_home)
        assert code == 1 and not fresh["ready"], fresh
        (model,) = fresh["models"]
        assert model["model_name"] == MODEL and model["serving"] == 2, model
        assert f"{MODEL.names.ensemble} v2 not READY" in " ".join(model["missing"]), model

        code, fixed = _probe(fleet, late, pod_home, "--reconcile")
        assert code == 0 and fixed["ready"], fixed
        assert [m["serving"] for m in fixed["models"]] == [2], fixed
        assert _ready_versions(fleet, late, MODEL.names.ensemble) == [2]
        assert _answers(late, 2) == want  # the recorded version's answers, identical to the fleet's
        assert _recorded(fleet) == (2, (2,))  # a probe never writes the recorded state

        # a rollback across the fleet (the late replica included), then one replica restarted
        everyone = [*fleet.servers, late]
        result = rollback_model(fleet.settings(everyone), MODEL, reason="test: the fleet back to v1")
        assert result["serving_version"] == 1
        assert _recorded(fleet) == (1, (1,))
        v1 = _answers(first, 1)
        assert v1 != want  # another checkpoint: the answers tell the versions apart
        assert all(_ready_versions(fleet, s, MODEL.names.ensemble) == [1] for s in everyone)
        assert all(_answers(s, 1) == v1 for s in everyone)

        restarted = fleet.servers[1]
        restarted.stop()  # explicit mode: a restarted Triton loads nothing until told
        restarted.start()
        code, again = _probe(fleet, restarted, fleet.root / "pod-home-restarted")
        assert code == 1 and not again["ready"], again
        code, again = _probe(fleet, restarted, fleet.root / "pod-home-restarted", "--reconcile")
        assert code == 0 and again["ready"] and [m["serving"] for m in again["models"]] == [1], again
        assert _ready_versions(fleet, restarted, MODEL.names.ensemble) == [1]
        assert _answers(restarted, 1) == v1
        (st,) = status(fleet.settings(everyone), [MODEL])
        assert st.agree, st.lines()
    finally:
        late.stop()


def test_an_object_changed_on_the_store_after_publish_is_named_by_status_and_restored_by_sync(
    released: Fleet,
) -> None:
    fleet = released
    settings = fleet.settings(fleet.servers)
    serving, _ = _recorded(fleet)
    assert serving is not None
    (st,) = status(settings, [MODEL])  # every object checked once: the next checks read only changed ones
    assert st.agree, st.lines()
    roots = [fleet.root / f"uncached-{i}" for i in range(3)] + [settings.triton_repository] * 3
    for root in roots:  # a host's first check (no cache), then repeated ones
        t0 = time.perf_counter()
        check = check_version(fleet.store, MODEL.names.models, serving, root)
        print(f"store check of version {serving}: {check.hashed} objects hashed in {time.perf_counter() - t0:.3f}s")
    assert check.intact and check.hashed == 0, check  # every ETag as found intact: nothing read again
    vocab = f"{MODEL.names.tokenizer}/{serving}/vocab.txt"  # small: its pin keeps its bytes
    graph = f"{MODEL.names.model}/{serving}/model.onnx"  # large: the working copy or the workspace has it
    published = {k: fleet.store.read_immutable(k) for k in (vocab, graph)}
    before = _answers(fleet.servers[0], serving)

    # by hand, bypassing seqcls: one object overwritten (a plain PUT, no sha256 metadata), one deleted
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=fleet.env["AWS_ENDPOINT_URL_S3"],
        aws_access_key_id=fleet.env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=fleet.env["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    s3.put_object(Bucket=fleet.location.bucket, Key=fleet.location.key(vocab), Body=b"[PAD]\n[UNK]\n")
    s3.delete_object(Bucket=fleet.location.bucket, Key=fleet.location.key(graph))

    (st,) = status(settings, [MODEL])
    print("\n".join(st.lines()))
    (problem,) = [p for p in st.problems if vocab in p]
    assert f"{vocab} has sha256" in problem and "its manifest records sha256" in problem, problem
    assert f"{graph} is missing" in problem and f"served version {serving}" in problem, problem
    assert "`seqcls sync --model-name seqcls` puts the recorded bytes back" in problem, problem
    # a host with no copy of the version (an empty working copy) sees the damage and says it cannot repair it
    (elsewhere,) = status(fleet.settings(fleet.servers, home=fleet.root / "other-host"), [MODEL])
    assert any(vocab in p and "no verified copy" in p for p in elsewhere.problems), elsewhere.problems

    t0 = time.perf_counter()
    (synced,) = sync(settings, [MODEL])
    print(f"sync restoring 2 objects: {time.perf_counter() - t0:.2f}s")
    assert synced.ok, synced.to_dict()
    assert sum(k in a for a in synced.actions for k in (vocab, graph)) == 2, synced.actions
    assert {k: fleet.store.read_immutable(k) for k in published} == published  # the bytes, their sha256 recorded
    (st,) = status(settings, [MODEL])
    assert st.agree, st.lines()

    # what a Triton loads from the store now is the published version: a restarted replica answers as before
    restarted = fleet.servers[2]
    restarted.stop()
    restarted.start()
    (synced,) = sync(settings, [MODEL])
    assert synced.ok, synced.to_dict()
    assert _answers(restarted, serving) == before


def test_a_restore_writes_only_over_the_bytes_it_found(seaweedfs: SeaweedFS) -> None:
    """``If-Match`` on the ETag of the changed bytes: a second repair (or a new edit) meanwhile is never overwritten."""
    store = seaweedfs.store(f"restore-{uuid.uuid4().hex[:8]}")
    key = "tokenizer/1/vocab.txt"
    store.put_immutable(key, b"published\n")
    got = store.read(key)
    assert got is not None
    changed = store.replace(key, b"edited by hand\n", got[1])  # what a check finds (its ETag)
    assert store.restore_immutable(key, b"published\n", changed) != changed
    assert store.read_immutable(key) == b"published\n"  # the recorded sha256 with it again
    with pytest.raises(ObjectConflict):  # a stale repair of the same finding
        store.restore_immutable(key, b"published\n", changed)
