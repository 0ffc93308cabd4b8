"""``seqcls gc`` through the real parts: a local Triton, MLflow and real release workspaces.

Seven releases of tiny checkpoints; the CLI release collects after its promote; a gc killed -9 between moving a
workspace's heavy artifacts aside and deleting them leaves a state ``status`` calls clean after one ``sync``;
then every version the policy keeps is still a working rollback target, and the served champion's graph is
still found (restored and re-scorable) from its kept workspace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.contract.names import ModelName
from seqcls.localtriton import LocalTriton
from seqcls.ops.disk import HEAVY
from seqcls.ops.trash import leftovers
from seqcls.registry.archive import ARCHIVED_TAG, REMOVED_TAG
from seqcls.registry.ledger import client
from seqcls.serving import restore
from seqcls.serving.pins import pin_path
from seqcls.serving.published import champion_graph
from seqcls.serving.repository import Repository
from tests.helpers.drills import Drill, drill_test, served_answers
from tests.helpers.gc import own_home_drill, tiny_checkpoints

NAME = ModelName("seqcls")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Seven tiny checkpoints (other seeds: other fingerprints), built once for the module."""
    return tiny_checkpoints(tmp_path_factory.mktemp("gc-ckpts"), seed=10)


@pytest.fixture
def gc_drill(drill_triton: LocalTriton, empty_mlflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A drill with a home of its own (gc must not collect the shared drill home's reused workspaces)."""
    return own_home_drill(drill_triton, empty_mlflow_db, tmp_path, monkeypatch)


def _workspace(d: Drill, version: int) -> Path:
    return Path(Repository.from_settings(d.settings, NAME).recorded(version, NAME.names.model)["workspace"])


def _gc_json(d: Drill, *args: str) -> dict:
    out = d.cli("gc", "--json", *args)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(out.stdout)


@drill_test
def test_gc_after_releases_a_kill_9_mid_gc_and_rollbacks_to_every_kept_version(
    gc_drill: Drill, checkpoints: list[Path], tmp_path: Path
) -> None:
    d = gc_drill
    for ckpt in checkpoints[:5]:
        d.release(ckpt)  # in-process: no gc after these promotes
    workspaces = {v: _workspace(d, v) for v in range(1, 6)}
    # publish prunes what no rollback within retain reaches when it runs: v6's publish prunes v1
    out = d.cli("release", "--checkpoint", str(checkpoints[5]))  # the CLI release collects after its promote
    assert out.returncode == 0, out.stderr[-3000:]
    assert "gc after promote of seqcls: freed" in out.stderr, out.stderr[-3000:]
    assert not any((workspaces[1] / h).exists() for h in HEAVY), out.stderr[-3000:]
    assert (workspaces[1] / "manifest.json").is_file() and (workspaces[1] / "parity" / "report.json").is_file()
    assert all((workspaces[2] / h).is_dir() for h in ("checkpoint", "static", "onnx"))  # v2: still published
    d.release(checkpoints[6])  # v7: v2 pruned, its workspace collectable
    dry = _gc_json(d)
    (model,) = dry["models"]
    collect = {Path(i["path"]).name for i in model["items"] if i["collect"] and i["kind"] == "workspace"}
    assert collect == {workspaces[2].name}, model["items"]
    archive = {i["path"] for i in model["items"] if i["collect"] and i["kind"] == "mlflow"}
    assert archive == {f"models:/{NAME}/2"}, model["items"]  # v1's was archived after the CLI release's promote
    kept = {Path(i["path"]).name: i["reasons"] for i in model["items"] if not i["collect"]}
    assert any("served Triton v7" in r for r in kept[_workspace(d, 7).name]), kept
    assert any("MLflow champion" in r for r in kept[_workspace(d, 7).name]), kept
    assert any("rollback target Triton v5" in r for r in kept[workspaces[5].name]), kept
    assert any("published/pinned" in r for r in kept[workspaces[3].name]), kept
    assert all((workspaces[2] / h).is_dir() for h in ("checkpoint", "static", "onnx"))  # a dry run deletes nothing

    out = d.cli("gc", "--apply", SEQCLS_FAULT_PLAN="die@gc:after-move")  # kill -9 with one directory moved aside
    assert out.returncode == -9, out.stderr[-3000:]
    assert leftovers(d.settings)
    sync = d.cli("sync")
    assert sync.returncode == 0, sync.stdout[-2000:] + sync.stderr[-3000:]
    status = d.cli("status")
    assert status.returncode == 0, status.stdout[-3000:]
    assert "disk:" in status.stdout and "release workspaces" in status.stdout, status.stdout
    assert not leftovers(d.settings)
    d.assert_invariant(served=7)
    assert _gc_json(d, "--apply")["ok"]
    assert not any((workspaces[2] / h).exists() for h in HEAVY)
    # MLflow: the versions of the collected workspaces (v1, v2) archived, those of the kept ones untouched
    c = client(d.settings)
    versions = {int(v.version): v for v in c.search_model_versions(f"name = '{NAME}'")}
    archived = {v for v, mv in versions.items() if REMOVED_TAG in mv.tags}
    assert archived == {1, 2}, {v: mv.tags.get(ARCHIVED_TAG) for v, mv in versions.items()}
    model_dir = Path(c.get_model_version_download_uri(NAME, "1").removeprefix("file://"))
    assert (model_dir / "MLmodel").is_file() and not (model_dir / "artifacts" / "model.onnx").exists()
    assert not c.list_artifacts(versions[1].run_id, "paddle_static")  # the graphs went; the evidence stays
    assert c.list_artifacts(versions[1].run_id, "parity")

    for version in (4, 5, 6, 7):  # the served version and every rollback target: kept whole
        assert all((_workspace(d, version) / h).is_dir() for h in ("checkpoint", "static", "onnx")), version

    # the served champion's graph: its live file gone and (so that the workspace is the only copy) its pin set
    # aside — the quality gate's re-scoring still finds it, and sync restores it, from the kept workspace
    repo = Repository.from_settings(d.settings, NAME)
    pin = pin_path(d.repo, NAME, 7)
    pinned = pin.read_bytes()
    pin.unlink()
    onnx = d.repo / NAME.names.model / "7" / "model.onnx"
    digest = sha256_file(onnx)
    onnx.unlink()
    try:
        _, source = champion_graph(repo, 7, tmp_path / "champion")
        assert "verified copy" in source
        sources = restore.plan(repo, 7).sources
        assert sources[digest].is_relative_to(_workspace(d, 7)), sources
        assert d.cli("sync").returncode == 0 and sha256_file(onnx) == digest
    finally:
        pin.write_bytes(pinned)

    # every version the policy keeps is a working rollback target
    served = {7: served_answers(d, NAME)}
    for expected in (6, 5, 4):
        out = d.cli("rollback", "--model-name", NAME, "--reason", "gc drill")
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert d.state().serving == expected
        served[expected] = served_answers(d, NAME)
        d.assert_invariant(served=expected)
    assert len({json.dumps(a) for a in served.values()}) > 1  # different checkpoints really answered

    # releasing an archived version's checkpoint again registers a new MLflow version (its graphs are gone)
    out = d.cli("release", "--checkpoint", str(checkpoints[0]))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    champion = c.get_model_version_by_alias(NAME, "champion")
    assert int(champion.version) == 8 and ARCHIVED_TAG not in champion.tags, champion
    d.assert_invariant(served=8)
