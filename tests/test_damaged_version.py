"""The way out of a damaged served version (issue 37), through a real local Triton and MLflow.

Each published version's ``release.json`` (every file hash) is pinned outside its directory, beside the
serving state, so ``seqcls sync`` restores a deleted or partly deleted version byte-identically from its
release workspace — and what it restored loads after a Triton restart.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.contract.names import ModelName
from tests.helpers.drills import Drill

NAME = ModelName("seqcls")
TEXTS = ["the same text before and after", "一段固定的测试文本", "x"]
DRILL = (pytest.mark.slow, pytest.mark.integration, pytest.mark.drill)


def drill_test(test):
    for mark in DRILL:
        test = mark(test)
    return test


def _answers(d: Drill, model_name: str = NAME) -> list:
    from seqcls.serving.client import TritonOps, endpoints_from_settings

    preds, probs = TritonOps(endpoints_from_settings(d.settings)[0]).infer(
        TEXTS, model=ModelName(model_name).names.ensemble
    )
    return [preds, [[round(float(p), 5) for p in row] for row in probs]]


def _version_files(d: Drill, version: int, model_name: str = NAME) -> dict[str, str]:
    """Every file of ``version`` in every Triton model of ``model_name``: relative path → sha256."""
    out = {}
    for model in ModelName(model_name).names.models:
        vdir = d.repo / model / str(version)
        out |= {str(p.relative_to(d.repo)): sha256_file(p) for p in sorted(vdir.rglob("*")) if p.is_file()}
    return out


def _no_traceback(out) -> None:
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


@drill_test
def test_a_deleted_served_version_is_restored_by_one_sync_and_survives_a_restart(
    drill: Drill, tiny_checkpoint_src: Path
) -> None:
    d = drill
    d.release(tiny_checkpoint_src)
    before, files = _answers(d), _version_files(d, 1)
    names = NAME.names
    # partly deleted: the graph and the record of its hashes
    (d.repo / names.model / "1" / "model.onnx").unlink()
    (d.repo / names.model / "1" / "release.json").unlink()
    out = d.cli("status")
    _no_traceback(out)
    assert out.returncode == 1 and "served version 1" in out.stdout, out.stdout[-3000:]
    out = d.cli("sync")
    _no_traceback(out)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert _version_files(d, 1) == files  # byte-identical, release.json included
    # every directory of the served version deleted (a lost volume): one sync puts it back
    for model in names.models:
        shutil.rmtree(d.repo / model / "1")
    out = d.cli("status")
    assert out.returncode == 1 and "served version 1" in out.stdout, out.stdout[-3000:]
    out = d.cli("sync", "--json")
    _no_traceback(out)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert any("restored" in a for a in json.loads(out.stdout)[0]["actions"]), out.stdout[-3000:]
    assert _version_files(d, 1) == files
    # what sync restored is what a restarted Triton loads
    d.server.stop()
    out = d.cli("triton", "start")
    try:
        _no_traceback(out)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert _answers(d) == before
        assert d.cli("status").returncode == 0
    finally:
        assert d.cli("triton", "stop").returncode == 0
        d.server.start()
    assert d.cli("sync").returncode == 0
    d.assert_invariant(served=1)
