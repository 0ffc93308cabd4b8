"""``seqcls gc`` on an ``s3://`` repository, through the real parts (SeaweedFS, a real Triton, real releases).

What it proves: gc on a store collects a killed publish's incomplete version and complete versions outside
retention, keeps what the recorded state, the configs and retention need, never lets a number be allocated
again, collects the release home's parts as on POSIX; a gc killed (SIGKILL) between a version's markers and
its objects, or a store that stops answering, leaves nothing a later gc, rollback, sync or status trips on.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from seqcls import faults
from seqcls.errors import ServingError
from seqcls.ops.disk import HEAVY
from seqcls.ops.gc import gc
from seqcls.ops.status import status
from seqcls.ops.sync import sync
from seqcls.release.intake import open_release
from seqcls.serving.s3lease import S3ReleaseLease
from seqcls.serving.s3state import S3ServingState
from seqcls.settings import Settings
from seqcls.steps import run_release
from seqcls.steps.rollback import rollback_model
from tests.helpers.s3release import (
    MODEL,
    Proxy,
    killed_release,
    run_seqcls,
    served,
    store_env,
    store_of,
    store_settings,
    triton_on_store,
)
from tests.helpers.seaweedfs import SeaweedFS, seaweedfs

__all__ = ["seaweedfs", "store_env"]  # the fixtures, imported for this module's tests

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: gc's item kinds (literals: the test reads what gc reports, as an operator's script would)
STORE_INCOMPLETE, STORE_VERSION, WORKSPACE = "store-incomplete", "store-version", "workspace"


def _store_items(result, kind: str) -> dict[int, object]:
    (m,) = result.models
    assert m.error is None, m.error
    return {int(i.path.rstrip("/").rsplit("/", 1)[1]): i for i in m.items if i.kind == kind}


def _heavy(home: Path) -> list[Path]:
    return sorted(p for p in (home / "releases").glob(f"{MODEL}/*/*") if p.name in HEAVY)


def _wait_for_lease(store, model) -> None:
    """A gc that could not release its lease (killed, or the store gone at the end): free after its short ttl."""
    lease = S3ReleaseLease(store.store, model)
    while not (view := lease.view()).free and not view.expired:
        time.sleep(1.0)


def _killed_gc(settings: Settings, home: Path) -> subprocess.CompletedProcess:
    script = (
        "from seqcls.ops.gc import gc\nfrom seqcls.settings import Settings\n"
        "gc(Settings.from_env(), apply=True, retain=1)\n"
    )
    plan = "die@gc:store-object-deleted"
    return run_seqcls(script, [], settings, home, SEQCLS_GC_MIN_AGE="0", SEQCLS_FAULT_PLAN=plan)


@pytest.fixture
def on_store(seaweedfs: SeaweedFS, store_env: tuple[str, Proxy], tmp_path: Path, home: Path):
    """(settings with gc_min_age 0, the store's relay): a real Triton on a fresh prefix, stopped after the test."""
    uri, proxy = store_env
    key = secrets.token_urlsafe(32)
    server = triton_on_store(seaweedfs, uri, tmp_path, key)
    try:
        yield replace(store_settings(server, home, uri, key), gc_min_age=0.0), proxy
    finally:
        server.stop()


def test_gc_on_s3_collects_killed_publishes_and_old_versions_and_survives_kill_and_outage(
    on_store: tuple[Settings, Proxy],
    tiny_checkpoint: Path,
    tiny_checkpoint_b: Path,
    tmp_path: Path,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings, proxy = on_store
    store = store_of(settings)
    run_release(open_release(tiny_checkpoint, settings=settings))
    run_release(open_release(tiny_checkpoint_b, settings=settings))
    assert served(settings) == (2, (2,))
    other = tmp_path / "ckpt-c"
    shutil.copytree(tiny_checkpoint, other)
    (other / "config.json").write_text((other / "config.json").read_text().replace("{", '{"seqcls_note": 1,', 1))
    died = killed_release(other, settings, home)
    assert died.returncode == -9, died.stderr[-3000:]
    incomplete = {v for m in MODEL.names.models for v in store.repo.versions(m).incomplete}
    assert incomplete == {3}, incomplete
    # the killed release holds the store's lease for its ttl (900 s): the operator breaks it, as on POSIX
    broke = run_seqcls(
        "import sys\nfrom seqcls.cli import main\nsys.exit(main(sys.argv[1:]))\n",
        ["lease", "break", "--model-name", str(MODEL), "--reason", "the release was killed"],
        settings,
        home,
    )
    assert broke.returncode == 0, broke.stderr[-3000:]
    assert f"lease of {MODEL}: broken (was " in broke.stdout, broke.stdout
    broken = S3ReleaseLease(store.store, MODEL).view()
    assert broken.free and broken.record.step == "broken: the release was killed", broken

    # dry run (the default): said per kind, with why kept; nothing deleted
    dry = gc(settings, retain=1)
    assert dry.ok, dry.to_dict()
    assert _store_items(dry, STORE_INCOMPLETE)[3].collect
    kept = _store_items(dry, STORE_VERSION)
    assert not kept[1].collect and any("previous" in r for r in kept[1].reasons), kept[1]
    assert not kept[2].collect and any("config.pbtxt" in r for r in kept[2].reasons), kept[2]
    assert {v for m in MODEL.names.models for v in store.repo.versions(m).incomplete} == {3}

    done = gc(settings, apply=True, retain=1)
    assert done.ok and done.to_dict()["freed"].keys() >= {STORE_INCOMPLETE, STORE_VERSION}
    assert 3 not in store.used_versions(MODEL.names.all)
    # numbers are never reused: the recorded state keeps the highest allocated number
    run_release(open_release(other, settings=settings))
    assert served(settings) == (4, (4,))

    # version 1 is now outside retention (retain 1: serving 4, previous 2): collected, with its workspace
    plan = gc(settings, retain=1)
    assert _store_items(plan, STORE_VERSION)[1].collect
    assert not _store_items(plan, STORE_VERSION)[2].collect
    assert not _store_items(plan, STORE_VERSION)[4].collect

    # the store down when gc starts: an error naming the store, nothing changed
    heavy, state_before = _heavy(home), S3ServingState(store.store, MODEL).read().state
    proxy.up.clear()
    try:
        with pytest.raises(ServingError, match=r"s3://"):
            gc(settings, apply=True, retain=1)
    finally:
        proxy.up.set()
    # ... and when it stops answering between version 1's markers and its objects: the model's error names
    # the store; nothing local collected, nothing recorded; version 1 is left incomplete (never served)
    real_point = faults.point

    def cut(name: str) -> None:
        if name == "gc:store-markers-deleted":
            proxy.up.clear()
        real_point(name)

    monkeypatch.setattr(faults, "point", cut)
    try:
        down = gc(settings, apply=True, retain=1)
    finally:
        proxy.up.set()
        monkeypatch.setattr(faults, "point", real_point)
    (m,) = down.models
    assert m.error and "s3://" in m.error, m.to_dict()
    assert _heavy(home) == heavy
    assert S3ServingState(store.store, MODEL).read().state == state_before
    assert 1 not in {v for m in MODEL.names.models for v in store.repo.versions(m).complete}
    assert served(settings) == (4, (4,))
    _wait_for_lease(store, MODEL)

    # gc killed (SIGKILL) in the middle of version 1's objects
    killed = _killed_gc(settings, home)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert 1 in store.used_versions(MODEL.names.models)
    (st,) = status(settings, [MODEL])
    assert st.recorded["serving"] == 4, st.problems
    _wait_for_lease(store, MODEL)

    finished = gc(settings, apply=True, retain=1)
    assert _store_items(finished, STORE_INCOMPLETE)[1].collect
    assert 1 not in store.used_versions(MODEL.names.all)
    collected = [i for i in finished.models[0].items if i.kind == WORKSPACE and i.collect]
    assert collected and _heavy(home) != heavy, "the release home's workspaces are collected on a store too"

    rollback_model(settings, MODEL, reason="test: after gc")
    assert served(settings) == (2, (2,))
    (synced,) = sync(settings, [MODEL])
    assert synced.ok and synced.serving == 2, synced.to_dict()
    (st,) = status(settings, [MODEL])
    assert st.agree, st.problems


def test_a_config_write_reads_the_config_once(seaweedfs: SeaweedFS, store_env, home: Path, monkeypatch) -> None:
    """``StoreRepository.write_config``: one GET for the compare-and-swap and the second-boundary wait."""
    from seqcls.serving.backend import StoreRepository
    from seqcls.settings import store_working_copy

    uri, _proxy = store_env
    store = StoreRepository.at(store_working_copy(home, uri))
    assert store is not None
    reads: list[str] = []
    for name in ("read", "read_stamped"):
        real = getattr(store.store, name)
        monkeypatch.setattr(store.store, name, lambda key, _r=real, _n=name: reads.append(_n) or _r(key))
    config = 'name: "t"\nbackend: "python"\nversion_policy: { specific: { versions: [ %d ] } }\n'
    monkeypatch.setattr(store.repo.__class__, "_require_complete", lambda self, model, version: None)
    store.write_config("t", config % 1)
    reads.clear()
    store.write_config("t", config % 2)
    assert reads == ["read_stamped"], reads
    assert store.repo.read_config("t")[0] == config % 2
