"""``seqcls gc`` and MLflow model versions, on a real MLflow (the sqlite store and a local artifact root): which
versions are archived or deleted, why the others are kept, what an archived version still has, a gc killed -9
between tagging a version and deleting its files; and the policy's plumbing (setting, CLI, models file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.errors import InputError
from seqcls.files import held
from seqcls.ops.gc import gc
from seqcls.registry.archive import ARCHIVED_TAG, COMPACTED_REMOVED_TAG, COMPACTED_TAG, REMOVED_TAG
from seqcls.settings import Settings
from tests.helpers.gc import NAME, mlflow_home
from tests.helpers.gc import fp as _fp
from tests.helpers.gc import mlflow_client as _client
from tests.helpers.gc import publish as _publish
from tests.helpers.gc import serve as _serve
from tests.helpers.gc import workspace as _workspace

__all__ = ["mlflow_home"]  # the fixture, imported for this module's tests

ONNX_BYTES, STATIC_BYTES = 40_000, 30_000


def _register(settings: Settings, i: int, tmp_path: Path) -> tuple[str, str]:
    """MLflow version ``i`` as register leaves one: a run (graphs + evidence + a metric) and a logged model
    with its ONNX graph; tags fingerprint and release_key. Returns (run artifact dir, model artifact dir)."""
    c = _client(settings)
    exp = c.get_experiment_by_name("gc-test")
    exp_id = exp.experiment_id if exp else c.create_experiment("gc-test", (tmp_path / "artifacts").as_uri())
    run = c.create_run(exp_id)
    src = tmp_path / f"src{i}"
    for rel, size in (("paddle_static/float32.pdiparams", STATIC_BYTES), ("parity/report.json", 10)):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(b"x" * size)
    c.log_artifacts(run.info.run_id, str(src))
    c.log_metric(run.info.run_id, "quality.micro_f1", 0.9)
    model = c.create_logged_model(exp_id, source_run_id=run.info.run_id, name="model")
    msrc = tmp_path / f"model{i}"
    (msrc / "artifacts").mkdir(parents=True)
    (msrc / "artifacts" / "model.onnx").write_bytes(b"o" * ONNX_BYTES)
    (msrc / "artifacts" / "vocab.txt").write_text("[PAD]\n")
    (msrc / "MLmodel").write_text("flavors: {}\n")
    c.log_model_artifacts(model.model_id, str(msrc))
    if not c.search_registered_models(f"name = '{NAME}'"):
        c.create_registered_model(NAME)
    tags = {"fingerprint": _fp(i), "release_key": f"key{i}"}
    mv = c.create_model_version(NAME, f"models:/{model.model_id}", run.info.run_id, tags=tags, model_id=model.model_id)
    assert int(mv.version) == i
    run_dir = Path(c.get_run(run.info.run_id).info.artifact_uri.removeprefix("file://"))
    return str(run_dir), model.artifact_location.removeprefix("file://")


@pytest.fixture
def six(mlflow_home: Settings, tmp_path: Path) -> dict[int, tuple[Path, Path]]:
    """Six releases: Triton v4, v5 and v6 published (v6 served, v5 previous); MLflow champion → 6,
    previous-champion → 5, and an alias ``candidate`` left on 3; workspaces 1-6."""
    out = {}
    for i in range(1, 7):
        _workspace(mlflow_home, i)
        run_dir, model_dir = _register(mlflow_home, i, tmp_path)
        out[i] = (Path(run_dir), Path(model_dir))
    for v in (4, 5, 6):
        _publish(mlflow_home, v, v)
    _serve(mlflow_home, (5, 5), (6, 6))
    c = _client(mlflow_home)
    for alias, v in (("champion", 6), ("previous-champion", 5), ("candidate", 3)):
        c.set_registered_model_alias(NAME, alias, str(v))
    return out


def _mlflow_items(result) -> dict[int, dict]:
    (m,) = result.to_dict()["models"]
    return {int(i["path"].rsplit("/", 1)[-1]): i for i in m["items"] if i["kind"] == "mlflow"}


def _has_graphs(dirs: tuple[Path, Path]) -> bool:
    run_dir, model_dir = dirs
    return (run_dir / "paddle_static").exists() or (model_dir / "artifacts" / "model.onnx").exists()


def test_dry_run_lists_versions_to_archive_and_why_the_rest_stay(mlflow_home: Settings, six) -> None:
    result = gc(mlflow_home)
    items = _mlflow_items(result)
    assert {v for v, i in items.items() if i["collect"]} == {1, 2}, items
    assert items[1]["bytes"] == ONNX_BYTES + STATIC_BYTES and set(items[1]["parts"]) == {"model.onnx", "paddle_static"}
    reasons = {v: " ".join(i["reasons"]) for v, i in items.items() if not i["collect"]}
    assert "served Triton v6" in reasons[6] and "MLflow alias champion" in reasons[6], reasons
    assert "previous Triton v5" in reasons[5] and "previous-champion" in reasons[5], reasons
    assert "MLflow alias candidate" in reasons[3], reasons
    assert "Triton v4 published/pinned" in reasons[4], reasons  # no alias: kept for its Triton version alone
    assert result.freed()["mlflow"] == 2 * (ONNX_BYTES + STATIC_BYTES)
    assert all(_has_graphs(six[i]) for i in six)  # a dry run deletes nothing
    text = "\n".join(result.lines())
    assert "collect MLflow versions' heavy artifacts: models:/seqcls/1" in text, text


def test_archive_deletes_graphs_and_keeps_the_version_its_tags_metrics_and_evidence(mlflow_home: Settings, six) -> None:
    result = gc(mlflow_home, apply=True)
    assert result.ok, result.lines()
    c = _client(mlflow_home)
    for i in (1, 2):
        run_dir, model_dir = six[i]
        assert not _has_graphs(six[i]), i
        mv = c.get_model_version(NAME, str(i))  # the version stays
        assert mv.tags["fingerprint"] == _fp(i) and mv.tags[ARCHIVED_TAG]
        assert json.loads(mv.tags[REMOVED_TAG]) and sum(json.loads(mv.tags[REMOVED_TAG]).values()) == 70_000
        assert (run_dir / "parity" / "report.json").is_file() and (model_dir / "artifacts" / "vocab.txt").is_file()
        assert c.get_run(mv.run_id).data.metrics["quality.micro_f1"] == 0.9
    for i in (3, 4, 5, 6):
        assert (six[i][0] / "paddle_static").is_dir() and (six[i][1] / "artifacts" / "model.onnx").is_file(), i
        assert ARCHIVED_TAG not in c.get_model_version(NAME, str(i)).tags
    again = gc(mlflow_home)  # archived versions are done: nothing more to collect, and not listed again
    assert again.freed()["mlflow"] == 0 and set(_mlflow_items(again)) == {3, 4, 5, 6}


def test_delete_policy_deletes_the_versions_and_keeps_their_runs(mlflow_home: Settings, six) -> None:
    result = gc(mlflow_home, apply=True, mlflow_versions="delete")
    assert result.ok, result.lines()
    c = _client(mlflow_home)
    left = {int(v.version) for v in c.search_model_versions(f"name = '{NAME}'")}
    assert left == {3, 4, 5, 6}
    assert not any(_has_graphs(six[i]) for i in (1, 2))
    assert (six[1][0] / "parity" / "report.json").is_file()  # the run and its evidence stay


def test_keep_policy_leaves_every_version_alone(mlflow_home: Settings, six) -> None:
    result = gc(mlflow_home, apply=True, mlflow_versions="keep")
    assert result.ok and not _mlflow_items(result)
    assert all(_has_graphs(six[i]) for i in six)


def test_a_version_whose_workspace_is_in_use_waits_with_it(mlflow_home: Settings, six) -> None:
    ws = mlflow_home.releases_dir / NAME / _fp(2)[:16]
    with held(ws / ".lock", timeout=0, what="a step", error=RuntimeError):  # a step is writing workspace 2
        result = gc(mlflow_home, apply=True)
    items = _mlflow_items(result)
    assert not items[2]["collect"] and "in use" in " ".join(items[2]["reasons"]), items[2]
    assert _has_graphs(six[2]) and not _has_graphs(six[1])


def test_gc_killed_between_tagging_and_deleting_is_finished_by_the_next(mlflow_home: Settings, six) -> None:
    env = {**os.environ, "SEQCLS_FAULT_PLAN": "die@gc:mlflow-tagged"}
    cmd = [sys.executable, "-m", "seqcls.cli", "gc", "--apply", "--json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == -9, out.stderr[-3000:]
    c = _client(mlflow_home)
    tags = c.get_model_version(NAME, "1").tags
    assert tags.get(ARCHIVED_TAG) and REMOVED_TAG not in tags  # tagged first: never reused by a release now
    assert _has_graphs(six[1])
    env.pop("SEQCLS_FAULT_PLAN")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert not any(_has_graphs(six[i]) for i in (1, 2))
    assert all(REMOVED_TAG in c.get_model_version(NAME, str(i)).tags for i in (1, 2))


def _small_left(dirs: tuple[Path, Path]) -> bool:
    run_dir, model_dir = dirs
    return (run_dir / "parity" / "report.json").exists() or (model_dir / "MLmodel").exists()


def test_archived_versions_of_compacted_releases_lose_their_small_artifacts_too(mlflow_home: Settings, six) -> None:
    result = gc(mlflow_home, apply=True, evidence_keep=1)  # workspaces 1-3 compacted (4-6: published/served)
    assert result.ok, result.lines()
    assert not any((mlflow_home.releases_dir / NAME / _fp(i)[:16]).exists() for i in (1, 2, 3))
    c = _client(mlflow_home)
    for i in (1, 2):  # archived and compacted: nothing of their files left; the version, tags and metrics stay
        mv = c.get_model_version(NAME, str(i))
        assert not _small_left(six[i]) and not _has_graphs(six[i]), i
        assert mv.tags["fingerprint"] == _fp(i) and mv.tags[COMPACTED_TAG] and mv.tags[REMOVED_TAG]
        assert "parity" in "".join(json.loads(mv.tags[COMPACTED_REMOVED_TAG])), mv.tags
        assert c.get_run(mv.run_id).data.metrics["quality.micro_f1"] == 0.9
    for i in (3, 4, 5, 6):  # 3: its alias keeps the version whole; 4-6: kept releases
        assert _small_left(six[i]) and _has_graphs(six[i]), i
        assert COMPACTED_TAG not in c.get_model_version(NAME, str(i)).tags
    items = _mlflow_items(gc(mlflow_home, evidence_keep=1))
    assert set(items) == {3, 4, 5, 6}, items  # done: not listed again


def test_gc_killed_between_tagging_compacted_and_deleting_is_finished_by_the_next(mlflow_home: Settings, six) -> None:
    env = {**os.environ, "SEQCLS_FAULT_PLAN": "die@gc:mlflow-compacted-tagged"}
    cmd = [sys.executable, "-m", "seqcls.cli", "gc", "--apply", "--evidence-keep", "1"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == -9, out.stderr[-3000:]
    c = _client(mlflow_home)
    tags = c.get_model_version(NAME, "1").tags
    assert tags.get(COMPACTED_TAG) and COMPACTED_REMOVED_TAG not in tags and _small_left(six[1])
    dry = subprocess.run([*cmd[:-3], "--evidence-keep", "1"], capture_output=True, text=True, timeout=300)
    assert "interrupted" in dry.stdout, dry.stdout
    env.pop("SEQCLS_FAULT_PLAN")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert not any(_small_left(six[i]) for i in (1, 2))
    assert all(COMPACTED_REMOVED_TAG in c.get_model_version(NAME, str(i)).tags for i in (1, 2))


def test_the_policy_is_checked_where_it_is_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from seqcls.airflow.models_file import load_models

    monkeypatch.setenv("SEQCLS_GC_MLFLOW_VERSIONS", "purge")
    with pytest.raises(InputError, match=r"SEQCLS_GC_MLFLOW_VERSIONS.*purge"):
        Settings.from_env()
    monkeypatch.setenv("SEQCLS_GC_MLFLOW_VERSIONS", "Delete")
    assert Settings.from_env().gc_mlflow_versions == "delete"
    out = subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "gc", "--mlflow-versions", "purge"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "--mlflow-versions" in out.stderr, out.stderr
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - name: alpha\n    params:\n      mlflow_versions: purge\n")
    with pytest.raises(InputError, match=r"params\.mlflow_versions.*purge"):
        load_models(models)
    models.write_text("models:\n  - name: alpha\n    params:\n      mlflow_versions: delete\n")
    (alpha,) = load_models(models)
    assert alpha.params["mlflow_versions"] == "delete"
