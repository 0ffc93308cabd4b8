"""The evidence horizon through the real parts: a local Triton, MLflow and real release workspaces.

Seven releases of tiny checkpoints with ``evidence_keep`` 3: the two oldest (pruned from Triton, no rollback
reaches them) are compacted; a gc killed -9 between writing an audit record and removing the workspace leaves a
state ``status`` calls clean after one ``sync`` and is finished by the next gc, as do a gc killed between tagging
a compacted release's MLflow version and deleting its files and a state-log rotation killed before compressing
(history unchanged); status and history say which releases were compacted; every version the policy keeps is
still a working rollback target and the champion's graph is still found from its kept workspace.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from seqcls.localtriton import LocalTriton
from seqcls.ops.evidence import audit_path, read_record
from seqcls.ops.trash import leftovers
from seqcls.registry.archive import COMPACTED_REMOVED_TAG
from seqcls.registry.ledger import client
from seqcls.serving.published import champion_graph
from seqcls.serving.repository import Repository
from seqcls.serving.statelog import log_path, segments
from tests.helpers.drills import Drill, drill_test, served_answers
from tests.helpers.gc import own_home_drill, tiny_checkpoints

NAME = ModelName("seqcls")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return tiny_checkpoints(tmp_path_factory.mktemp("evidence-ckpts"), seed=40)


@pytest.fixture
def drill(drill_triton: LocalTriton, empty_mlflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return own_home_drill(drill_triton, empty_mlflow_db, tmp_path, monkeypatch, SEQCLS_GC_EVIDENCE_KEEP="3")


def _workspace(d: Drill, version: int) -> Path:
    return Path(Repository.from_settings(d.settings, NAME).recorded(version, NAME.names.model)["workspace"])


@drill_test
def test_old_releases_are_compacted_and_every_kept_version_still_rolls_back(
    drill: Drill, checkpoints: list[Path], tmp_path: Path
) -> None:
    d = drill
    workspaces: dict[int, Path] = {}
    for v, ckpt in enumerate(checkpoints, start=1):
        d.release(ckpt)  # in-process: no gc after these promotes
        workspaces[v] = _workspace(d, v)
    dry = json.loads(d.cli("gc", "--json").stdout)
    (model,) = dry["models"]
    compact = {Path(i["path"]) for i in model["items"] if i["kind"] == "evidence" and i["collect"]}
    assert compact == {workspaces[1], workspaces[2]}, model["items"]  # 3, 4: published; 5-7: the newest 3

    out = d.cli("gc", "--apply", SEQCLS_FAULT_PLAN="die@gc:evidence-written")  # kill -9: record written, ws whole
    assert out.returncode == -9, out.stderr[-3000:]
    first = audit_path(d.settings, NAME, workspaces[1].name)
    assert read_record(first) is not None and (workspaces[1] / "manifest.json").is_file()
    sync = d.cli("sync")
    assert sync.returncode == 0, sync.stdout[-2000:] + sync.stderr[-3000:]
    assert d.cli("status").returncode == 0
    d.assert_invariant(served=7)
    out = d.cli("gc", "--apply", SEQCLS_FAULT_PLAN="die@gc:mlflow-compacted-tagged")  # the MLflow side killed
    assert out.returncode == -9, out.stderr[-3000:]
    assert not workspaces[1].exists() and not workspaces[2].exists()  # compacted; MLflow v1 tagged, files there
    assert d.cli("sync").returncode == 0 and d.cli("status").returncode == 0
    d.assert_invariant(served=7)
    out = d.cli("gc", "--apply")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert not leftovers(d.settings)
    for v in (1, 2):
        assert not workspaces[v].exists(), v
        record = read_record(audit_path(d.settings, NAME, workspaces[v].name))
        assert record is not None and record["manifest"]["steps"]["evaluate"]["status"] == "ok", v
        assert any(r.endswith(".json") and "json" in e for r, e in record["files"].items()), record["files"].keys()
    for v in range(3, 8):
        assert workspaces[v].is_dir() and not audit_path(d.settings, NAME, workspaces[v].name).exists(), v
    c = client(d.settings)
    for v in (1, 2):  # archived, then what was left of them: the version, its tags and metrics stay
        mv = c.get_model_version(NAME, str(v))
        assert COMPACTED_REMOVED_TAG in mv.tags and not c.list_artifacts(mv.run_id), v
        assert c.get_run(mv.run_id).data.metrics, v
    status = d.cli("status")
    assert status.returncode == 0 and "2 compacted releases' audit records" in status.stdout, status.stdout
    history = d.cli("history")
    assert history.returncode == 0 and history.stdout.count("(compacted)") >= 2, history.stdout

    # the state log rotated by a process killed -9 before compressing: status clean after one sync, history whole
    log_file = log_path(d.repo, NAME)
    code = f"from pathlib import Path; from seqcls.serving.statelog import rotate; rotate(Path({str(log_file)!r}), 1)"
    killed = subprocess.run([sys.executable, "-c", code], env={**d.env, "SEQCLS_FAULT_PLAN": "die@statelog:rotated"})
    assert killed.returncode == -9 and segments(log_file) and not log_file.exists()
    assert d.cli("sync").returncode == 0 and d.cli("status").returncode == 0
    d.assert_invariant(served=7)
    again = d.cli("history")
    assert again.returncode == 0 and again.stdout == history.stdout, again.stdout

    repo = Repository.from_settings(d.settings, NAME)
    _, source = champion_graph(repo, 7, tmp_path / "champion")  # the quality gate's re-scoring still finds it
    assert source
    served = {7: served_answers(d, NAME)}
    for expected in (6, 5, 4):
        out = d.cli("rollback", "--model-name", NAME, "--reason", "evidence drill")
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert d.state().serving == expected
        served[expected] = served_answers(d, NAME)
        d.assert_invariant(served=expected)
    assert len({json.dumps(a) for a in served.values()}) > 1
