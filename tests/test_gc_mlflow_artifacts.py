"""What of a release's MLflow artifacts outlives gc, on a real MLflow (sqlite store, local artifact root).

The growth benchmark found MLflow's artifact store growing by ≈ 17 kB a release after gc and compaction. Two
causes, each tested here: an archived version's logged model kept everything but its graph (the pyfunc's code,
the tokenizer's character classes, input examples, environment files: nothing loads it without the graph), and
runs no version names — a refused release's, a re-release's re-run gates — kept their evidence for ever
(:func:`seqcls.registry.archive.plan_runs` / :func:`~seqcls.registry.archive.collect_run`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from seqcls.ops.gc import gc
from seqcls.registry import archive
from seqcls.settings import Settings
from tests.helpers.gc import NAME, mlflow_home
from tests.helpers.gc import fp as _fp
from tests.helpers.gc import mlflow_client as _client
from tests.helpers.gc import publish as _publish
from tests.helpers.gc import serve as _serve
from tests.helpers.gc import workspace as _workspace

__all__ = ["mlflow_home"]  # the fixture, imported for this module's tests

#: A logged model as the register step writes one (relative path → bytes): graph, pyfunc code, small files.
MODEL_FILES = {
    "MLmodel": 2_000,
    "requirements.txt": 80,
    "conda.yaml": 190,
    "python_env.yaml": 120,
    "input_example.json": 325,
    "serving_input_example.json": 424,
    "pyfunc.py": 9_700,
    "code/seqcls_engine.py": 18_400,
    "code/seqcls_text.py": 11_900,
    "artifacts/model.onnx": 180_000,
    "artifacts/release.json": 1_770,
    "artifacts/vocab.txt": 780,
    "artifacts/seqcls_text_classes.json": 22_400,
}
#: A registered release's run: exported graph, gate evidence, tokenizer and checkpoint files.
RUN_FILES = {
    "paddle_static/float32.pdiparams": 155_000,
    "paddle_static/float32.json": 60_000,
    "parity/report.json": 1_360,
    "parity/expected.json": 29_000,
    "parity/plot.png": 48_000,
    "quality/evaluation.json": 2_500,
    "tokenizer/vocab.txt": 780,
    "checkpoint/config.json": 890,
}
#: A run no version names (a refused release, a re-release): the gates' evidence only.
EVIDENCE_FILES = {k: v for k, v in RUN_FILES.items() if k.startswith(("parity/", "quality/"))}


def _write(root: Path, files: dict[str, int]) -> Path:
    for rel, size in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * size)
    return root


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()


def _run(settings: Settings, tmp_path: Path, i: int, files: dict[str, int], started: int, **tags: str) -> str:
    """A finished run of release ``i`` in experiment ``seqcls-<model>`` with ``files``, a metric and ``tags``."""
    c = _client(settings)
    exp = c.get_experiment_by_name(f"seqcls-{NAME}")
    exp_id = exp.experiment_id if exp else c.create_experiment(f"seqcls-{NAME}", (tmp_path / "artifacts").as_uri())
    run = c.create_run(exp_id, start_time=started, tags={"fingerprint": _fp(i), **tags})
    c.log_artifacts(run.info.run_id, str(_write(tmp_path / f"run-src-{run.info.run_id}", files)))
    c.log_metric(run.info.run_id, "eval.micro_f1", 0.9)
    c.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def _register(settings: Settings, tmp_path: Path, i: int) -> tuple[Path, Path]:
    """MLflow version ``i`` as the register step leaves one; (run artifact dir, logged model artifact dir)."""
    c = _client(settings)
    run_id = _run(settings, tmp_path, i, RUN_FILES, 1_000 * i, **{"seqcls.outcome": "registered"})
    exp_id = c.get_run(run_id).info.experiment_id
    model = c.create_logged_model(exp_id, source_run_id=run_id, name="model")
    c.log_model_artifacts(model.model_id, str(_write(tmp_path / f"model-src-{i}", MODEL_FILES)))
    if not c.search_registered_models(f"name = '{NAME}'"):
        c.create_registered_model(NAME)
    tags = {"fingerprint": _fp(i), "release_key": f"key{i}"}
    mv = c.create_model_version(NAME, f"models:/{model.model_id}", run_id, tags=tags, model_id=model.model_id)
    assert int(mv.version) == i
    run_dir = Path(c.get_run(run_id).info.artifact_uri.removeprefix("file://"))
    return run_dir, Path(model.artifact_location.removeprefix("file://"))


def test_an_archived_version_keeps_only_its_listed_small_evidence(mlflow_home: Settings, tmp_path: Path) -> None:
    dirs = {}
    for i in (1, 2, 3):
        _workspace(mlflow_home, i)
        dirs[i] = _register(mlflow_home, tmp_path, i)
    for v in (2, 3):
        _publish(mlflow_home, v, v)
    _serve(mlflow_home, (2, 2), (3, 3))
    _client(mlflow_home).set_registered_model_alias(NAME, "champion", "3")

    result = gc(mlflow_home, apply=True)
    assert result.ok, result.lines()

    run_dir, model_dir = dirs[1]
    assert _files(run_dir) == {k for k in RUN_FILES if not k.startswith("paddle_static/")}
    assert _files(model_dir) == {"MLmodel", "requirements.txt", "artifacts/release.json", "artifacts/vocab.txt"}
    removed = json.loads(_client(mlflow_home).get_model_version(NAME, "1").tags[archive.REMOVED_TAG])
    kept = {"MLmodel", "requirements.txt", "artifacts/release.json", "artifacts/vocab.txt"}
    went = sum(v for k, v in MODEL_FILES.items() if k not in kept) + 215_000
    assert sum(removed.values()) == went, removed
    assert {u.rsplit("/", 1)[-1] for u in removed} >= {"code", "pyfunc.py", "model.onnx", "paddle_static"}, removed
    for i in (2, 3):  # served and previous: whole
        assert _files(dirs[i][0]) == set(RUN_FILES) and _files(dirs[i][1]) == set(MODEL_FILES), i


@pytest.fixture
def orphans(mlflow_home: Settings, tmp_path: Path) -> dict[str, str]:
    """Versions 1 (registered long ago) and 2; runs no version names: a refused attempt of release 3, two
    re-releases of release 2 (the gates re-ran: ``reused``), a refused attempt of release 4; name → run id."""
    for i in (1, 2):
        _register(mlflow_home, tmp_path, i)
    now = int(time.time() * 1000)
    return {
        "refused3": _run(mlflow_home, tmp_path, 3, EVIDENCE_FILES, now - 4_000, **{"seqcls.outcome": "quality_failed"}),
        "reused2_old": _run(mlflow_home, tmp_path, 2, EVIDENCE_FILES, now - 3_000, **{"seqcls.outcome": "reused"}),
        "reused2_new": _run(mlflow_home, tmp_path, 2, EVIDENCE_FILES, now - 2_000, **{"seqcls.outcome": "reused"}),
        "refused4": _run(mlflow_home, tmp_path, 4, EVIDENCE_FILES, now - 1_000, **{"seqcls.outcome": "gate_failed"}),
    }


def _run_files(settings: Settings, run_id: str) -> set[str]:
    return _files(Path(_client(settings).get_run(run_id).info.artifact_uri.removeprefix("file://")))


def test_runs_no_version_names_lose_their_artifacts_once_their_release_is_compacted_or_superseded(
    mlflow_home: Settings, orphans: dict[str, str]
) -> None:
    c = _client(mlflow_home)
    compacted = {_fp(1)[:16], _fp(3)[:16]}  # release 1 has a version: its run is the version's, not touched here
    plans = archive.plan_runs(c, str(NAME), compacted)
    by_run = {rp.run_id: rp for rp in plans}
    assert set(by_run) == {orphans["refused3"], orphans["reused2_old"]}, [(p.run_id, p.why) for p in plans]
    assert "compacted" in by_run[orphans["refused3"]].why and "newer re-release" in by_run[orphans["reused2_old"]].why
    assert sum(by_run[orphans["refused3"]].parts.values()) == sum(EVIDENCE_FILES.values())
    for rp in plans:
        archive.collect_run(c, rp)
    for name, run_id in orphans.items():
        run = c.get_run(run_id)
        if name in ("refused3", "reused2_old"):  # files gone; the run, its tags and metrics stay
            assert not _run_files(mlflow_home, run_id), name
            assert json.loads(run.data.tags[archive.RUN_REMOVED_TAG]) and run.data.metrics["eval.micro_f1"] == 0.9
        else:  # the newest re-release's evidence, and a refused release whose workspace is kept
            assert _run_files(mlflow_home, run_id) == set(EVIDENCE_FILES), name
    assert not archive.plan_runs(c, str(NAME), compacted)  # done: nothing more to collect


def test_a_run_collection_interrupted_after_tagging_is_finished_by_the_next(
    mlflow_home: Settings, orphans: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = _client(mlflow_home)
    (rp,) = archive.plan_runs(c, str(NAME), set())  # the superseded re-release only
    monkeypatch.setenv("SEQCLS_FAULT_PLAN", "fail@gc:runs-tagged")
    with pytest.raises(RuntimeError, match="gc:runs-tagged"):
        archive.collect_run(c, rp)
    tags = c.get_run(rp.run_id).data.tags
    assert tags[archive.RUN_COLLECTING_TAG] and archive.RUN_REMOVED_TAG not in tags
    assert _run_files(mlflow_home, rp.run_id) == set(EVIDENCE_FILES)  # tagged first, nothing deleted yet
    monkeypatch.delenv("SEQCLS_FAULT_PLAN")
    (again,) = archive.plan_runs(c, str(NAME), set())
    assert again.run_id == rp.run_id and again.unfinished
    archive.collect_run(c, again)
    assert not _run_files(mlflow_home, rp.run_id) and archive.RUN_REMOVED_TAG in c.get_run(rp.run_id).data.tags


def test_the_outcome_names_are_the_runs_modules() -> None:
    from seqcls.registry import runs

    assert (archive.OUTCOME_TAG, archive.REUSED, archive.REGISTERED) == (runs.OUTCOME_TAG, runs.REUSED, runs.REGISTERED)


def test_the_growth_bench_inventory_names_each_files_owner_and_kind(mlflow_home: Settings, orphans) -> None:
    from seqcls_tools.bench.growth import inventory_markdown, mlflow_inventory

    root = Path(_client(mlflow_home).get_experiment_by_name(f"seqcls-{NAME}").artifact_location.removeprefix("file://"))
    rows = {(r["owner"], r["kind"]): r for r in mlflow_inventory(str(mlflow_home.mlflow_tracking_uri), root.parent)}
    reused = rows[("no version (run reused)", "run evidence (parity/)")]
    assert reused["owners"] == 2 and reused["bytes"] == 2 * sum(v for k, v in EVIDENCE_FILES.items() if "parity/" in k)
    assert rows[("version live", "model code (pyfunc.py, code/)")]["owners"] == 2, sorted(rows)
    assert rows[("no version (run gate_failed)", "run evidence (quality/)")]["files"] == 1
    assert "| **all** |" in inventory_markdown(list(rows.values()), 4)


def test_gc_collects_a_superseded_rerun_and_a_dry_run_only_says_so(mlflow_home: Settings, orphans) -> None:
    old, new = orphans["reused2_old"], orphans["reused2_new"]
    for i in (1, 2):  # the releases' workspaces: what makes the model one gc knows
        _workspace(mlflow_home, i)
    planned = gc(mlflow_home)  # dry run: listed with why, nothing deleted
    items = {i.path: i for m in planned.models for i in m.items if i.path.startswith("runs:/")}
    assert set(items) == {f"runs:/{old}"} and items[f"runs:/{old}"].collect, planned.lines()
    assert "newer re-release" in " ".join(items[f"runs:/{old}"].parts)
    assert _run_files(mlflow_home, old) == set(EVIDENCE_FILES)
    applied = gc(mlflow_home, apply=True)
    assert applied.ok, applied.lines()
    assert not _run_files(mlflow_home, old) and _run_files(mlflow_home, new) == set(EVIDENCE_FILES)
    assert not [i for m in gc(mlflow_home).models for i in m.items if i.path.startswith("runs:/")]


def test_the_run_search_leaves_the_versions_own_runs_out_unless_versions_are_deleted(
    mlflow_home: Settings, orphans: dict[str, str]
) -> None:
    """A daily schedule's runs are nearly all versions' own (``registered``): MLflow filters them out of gc's
    search, so its cost follows the runs no version names. Under the ``delete`` policy a version may be gone and
    its run no version names: then they are searched too."""
    c = _client(mlflow_home)
    exp = c.get_experiment_by_name(f"seqcls-{NAME}").experiment_id
    assert {r.info.run_id for r in archive._runs(c, exp, False)} == set(orphans.values())
    assert len(archive._runs(c, exp, True)) == len(orphans) + 2  # the two versions' runs
    c.delete_model_version(NAME, "1")  # the delete policy's end of a version: its run no version names now
    compacted = {_fp(1)[:16]}
    assert _fp(1)[:16] not in {rp.fingerprint for rp in archive.plan_runs(c, str(NAME), compacted)}
    (rp,) = [rp for rp in archive.plan_runs(c, str(NAME), compacted, registered=True) if rp.fingerprint == _fp(1)[:16]]
    assert rp.outcome == "registered" and "compacted" in rp.why and rp.parts
