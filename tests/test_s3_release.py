"""Releases onto an ``s3://`` model repository, through the real parts.

A SeaweedFS ``weed server`` on loopback (the session fixture of :mod:`tests.helpers.seaweedfs`), the
``tritonserver`` of the nvidia-pytriton wheel started on ``s3://127.0.0.1:PORT/bucket/prefix`` in explicit
mode (credentials in its environment only), the tiny ERNIE checkpoints, and the release steps unchanged:
``SEQCLS_TRITON_REPOSITORY=s3://…`` makes the repository directory a working copy of the store, and the
state, the lease, every version and every config Triton reads are on the store.
"""

from __future__ import annotations

import json
import secrets
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from seqcls import faults
from seqcls.errors import ServingError
from seqcls.localtriton import LocalTriton
from seqcls.ops.history import history, read_entries
from seqcls.ops.status import status
from seqcls.ops.sync import sync
from seqcls.release.intake import open_release
from seqcls.serving.published import champion_graph
from seqcls.serving.repository import Repository
from seqcls.serving.s3state import S3ServingState
from seqcls.steps import run_release
from seqcls.steps.rollback import rollback_model
from tests.helpers.s3release import (
    MODEL,
    Proxy,
    killed_release,
    served,
    store_env,
    store_of,
    store_settings,
    triton_on_store,
)
from tests.helpers.seaweedfs import SeaweedFS, seaweedfs

__all__ = ["seaweedfs", "store_env"]  # the fixtures, imported for this module's tests

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _ready(server: LocalTriton, model: str, version: int | str = "") -> bool:
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(url=server.grpc_url).is_model_ready(model, str(version))


def _version_files(root: Path, version: int) -> dict[str, dict[str, bytes]]:
    return {m: {p.name: p.read_bytes() for p in (root / m / str(version)).iterdir()} for m in MODEL.names.models}


def test_release_status_rollback_and_sync_after_a_restart_on_s3(
    seaweedfs: SeaweedFS,
    store_env: tuple[str, Proxy],
    tiny_checkpoint: Path,
    tiny_checkpoint_b: Path,
    tmp_path: Path,
    home: Path,
) -> None:
    uri, proxy = store_env
    key = secrets.token_urlsafe(32)
    server = triton_on_store(seaweedfs, uri, tmp_path, key)
    try:
        settings = store_settings(server, home, uri, key)
        results = {r.step: r for r in run_release(open_release(tiny_checkpoint, settings=settings))}
        assert results["expose"].status == "ok" and results["promote"].status == "ok"
        assert served(settings) == (1, (1,))
        store = store_of(settings)
        assert all(store.repo.versions(m).complete == (1,) for m in MODEL.names.models)

        run_release(open_release(tiny_checkpoint_b, settings=settings))
        assert served(settings) == (2, (2,))
        state = S3ServingState(store.store, MODEL).read().state
        assert (state.serving, state.previous) == (2, 1)

        (st,) = status(settings, [MODEL])
        assert st.agree, st.problems
        assert st.recorded["serving"] == 2 and st.recorded["previous"] == 1
        assert st.lease is None, st.lease  # the store's lease, released by the release

        result = rollback_model(settings, MODEL, reason="test: back to v1")
        assert result["serving_version"] == 1
        assert served(settings) == (1, (1,))
        (st,) = status(settings, [MODEL])
        assert st.agree and st.recorded["serving"] == 1, st.problems

        server.stop()  # explicit mode: a restarted Triton loads nothing until told
        server.start()
        assert not _ready(server, MODEL.names.ensemble)
        before = S3ServingState(store.store, MODEL).read()
        proxy.up.clear()  # the store down during sync: its error names the store, the recorded state is untouched
        try:
            (cut,) = sync(settings, [MODEL])
        finally:
            proxy.up.set()
        assert not cut.ok and "s3://" in " ".join(cut.errors.values()), cut.to_dict()
        assert "secret" not in json.dumps(cut.to_dict()).lower()
        assert S3ServingState(store.store, MODEL).read().etag == before.etag
        (synced,) = sync(settings, [MODEL])
        assert synced.ok and synced.serving == 1, synced.to_dict()
        (st,) = status(settings, [MODEL])
        assert st.agree, st.problems
        # the champion re-scored on a host whose working copy lacks it: read from the store, hash-checked
        root = Path(str(settings.triton_repository))
        published = _version_files(root, 1)
        for m in MODEL.names.models:
            shutil.rmtree(root / m / "1")
        repo = Repository.from_settings(settings, MODEL)
        _graph, source = champion_graph(repo, 1, tmp_path / "scratch-1")
        assert source == "its published files"
        assert _version_files(root, 1) == published
        tokenizer = MODEL.names.tokenizer
        store.store.delete(f"{tokenizer}/1/vocab.txt")  # replaced on the store by other bytes (their own sha256)
        store.store.put_immutable(f"{tokenizer}/1/vocab.txt", b"[PAD]\n[UNK]\n")
        shutil.rmtree(root / tokenizer / "1")
        with pytest.raises(ServingError, match=rf"{tokenizer}/1/vocab.txt: sha256 .* its manifest records"):
            champion_graph(repo, 1, tmp_path / "scratch-2")
        assert not (root / tokenizer / "1").exists()  # nothing of the damaged version was copied

        events = [e.record["event"] for e in S3ServingState(store.store, MODEL).events().events]
        assert events.count("state") >= 6, events  # every recorded change has its event on the store

        # another host (its own home: an empty working copy) reads the history this host's log holds, from the store
        def row(e) -> tuple:  # a promote's old Triton version comes from the MLflow join, not the log
            return e.kind, None if e.kind == "promote" else e.from_version, e.to_version, e.at

        mine = [row(e) for e in read_entries(root, MODEL)[0]]
        other = replace(
            store_settings(server, tmp_path / "host-b", uri, key), mlflow_tracking_uri=settings.mlflow_tracking_uri
        )
        theirs = history(other, [MODEL])
        assert [row(e) for e in theirs.entries] == mine and len(mine) >= 7
        assert {e.to_mlflow for e in theirs.entries if e.kind == "expose"} == {1, 2}, theirs.to_dict()
        newest = history(other, [MODEL], limit=2)
        assert [(e.kind, e.at) for e in newest.entries] == [(k, at) for k, _f, _t, at in mine[-2:]]
        assert newest.omitted >= len(mine) - 2 and not newest.notes, newest.notes
        secret = seaweedfs.credentials.secret_access_key
        for path in home.rglob("*"):
            if path.is_file() and path.stat().st_size < 5_000_000:
                assert secret.encode() not in path.read_bytes(), f"{path} holds the store's secret"
    finally:
        server.stop()


def test_a_publish_killed_before_its_marker_is_never_served_and_a_dead_store_changes_nothing(
    seaweedfs: SeaweedFS,
    store_env: tuple[str, Proxy],
    tiny_checkpoint: Path,
    tiny_checkpoint_b: Path,
    tmp_path: Path,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uri, proxy = store_env
    key = secrets.token_urlsafe(32)
    server = triton_on_store(seaweedfs, uri, tmp_path, key)
    try:
        settings = store_settings(server, home, uri, key)
        run_release(open_release(tiny_checkpoint, settings=settings))
        assert served(settings) == (1, (1,))

        # the store down while version 2 is published: a clear error naming the store, nothing served changed
        real_point = faults.point

        def cut_at_upload(name: str) -> None:
            if name == "publish:written":
                proxy.up.clear()
            real_point(name)

        monkeypatch.setattr(faults, "point", cut_at_upload)
        with pytest.raises(
            ServingError, match=r"publishing version \d+ of 'seqcls' to the object store s3://.*release-"
        ) as failed:
            run_release(open_release(tiny_checkpoint_b, settings=settings))
        assert "secret" not in str(failed.value).lower()
        monkeypatch.setattr(faults, "point", real_point)
        proxy.up.set()
        assert served(settings) == (1, (1,))
        assert _ready(server, MODEL.names.ensemble, 1)

        # the next release works, under a version number nothing on the store used
        run_release(open_release(tiny_checkpoint_b, settings=settings))
        serving, config = served(settings)
        assert serving == config[0] and serving > 1
        store = store_of(settings)
        used = store.used_versions(MODEL.names.models)

        # a publish killed (SIGKILL) just before a store marker: never loaded, never served
        other = tmp_path / "ckpt-c"
        shutil.copytree(tiny_checkpoint, other)
        cfg = json.loads((other / "config.json").read_text())
        cfg["seqcls_note"] = "another release"
        (other / "config.json").write_text(json.dumps(cfg))
        died = killed_release(other, settings, home)
        assert died.returncode == -9, died.stderr[-3000:]
        incomplete = {v for m in MODEL.names.models for v in store.repo.versions(m).incomplete}
        assert incomplete and max(incomplete) > max(used), (incomplete, used)
        assert served(settings) == (serving, (serving,))
        assert not any(_ready(server, m, v) for m in MODEL.names.models for v in incomplete)
        assert _ready(server, MODEL.names.ensemble, serving)
    finally:
        server.stop()
