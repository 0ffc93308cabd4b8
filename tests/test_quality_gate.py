"""The quality gate through the real parts: a trained demo model, ONNX Runtime, a real Triton and MLflow.

One quick demo model is trained per test session (~35 s, tests/helpers/demo_models.py, shared with
test_demo.py). Its worse "retrain" is the same checkpoint with four leaf labels switched off (their
classifier bias at -30: never predicted), so the regression is certain and known; its equal "retrain"
is the same weights under another fingerprint (its config.json written with another indent). The
eval set is the demo's held-out split, as an operator's file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from seqcls.config import ReleaseConfig
from seqcls.contract.names import ModelName
from seqcls.errors import GateError, InputError
from seqcls.release.intake import open_release
from seqcls.release.kept import locate_eval_set
from seqcls.serving.published import served_graph
from seqcls.serving.repository import Repository
from tests.helpers.demo_models import DEMO_TEST, SWITCHED_OFF, demo_eval_file, quick_demo_model, worse_retrain
from tests.helpers.drills import Drill, champion

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quick_demo_model(tmp_path_factory).path  # trained once per session, shared (read only)


@pytest.fixture(scope="module")
def worse(good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return worse_retrain(good, tmp_path_factory.mktemp("quality") / "worse")


@pytest.fixture(scope="module")
def equal(good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("quality") / "equal"
    shutil.copytree(good, out)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    (out / "config.json").write_text(json.dumps(config, indent=4, ensure_ascii=False), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def eval_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's held-out split as PaddleNLP's text<TAB>label,label file (the other format is JSONL)."""
    return demo_eval_file(tmp_path_factory.mktemp("eval") / "test.txt")


def _mlflow_runs(drill: Drill, quality: str) -> list:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=drill.settings.mlflow_tracking_uri)
    exp = c.get_experiment_by_name("seqcls-seqcls")
    return c.search_runs([exp.experiment_id], filter_string=f"tags.`seqcls.gates` = '{quality}'")


def _versions(drill: Drill) -> list[int]:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=drill.settings.mlflow_tracking_uri)
    return sorted(int(v.version) for v in c.search_model_versions("name='seqcls'"))


def test_first_release_then_a_worse_retrain_is_refused_and_an_equal_one_goes_live(
    drill: Drill, good: Path, worse: Path, equal: Path, eval_set: Path
) -> None:
    first = {r.step: r for r in drill.release(good, eval_set=str(eval_set))}
    ev = first["evaluate"].summary
    assert ev["passed"] and ev["champion_version"] is None and ev["micro_f1"] > 0.8, ev
    assert ev["eval_set"]["sha256"] == hashlib.sha256(eval_set.read_bytes()).hexdigest()
    assert "first release" in first["evaluate"].message
    assert first["smoke"].summary["shadow"] == {**first["smoke"].summary["shadow"], "offline_mismatch": 0}
    assert "disagree" not in first["smoke"].summary["shadow"]  # nothing served beside the first release
    drill.assert_invariant(served=1)
    versions = _versions(drill)

    with pytest.raises(GateError) as refused:
        drill.release(worse, eval_set=str(eval_set))
    text = str(refused.value)
    assert "max_f1_drop on micro_f1" in text and "Triton v1" in text and "bad_cases.tsv" in text, text
    drill.assert_invariant(served=1)  # served, recorded and champion unchanged; status agrees
    assert drill.state().candidate is None and champion(drill.settings) == 1
    assert _versions(drill) == versions  # nothing registered
    bad = open_release(worse, settings=drill.settings).workspace
    evaluation = json.loads((bad.failed_dir("evaluate") / "evaluation.json").read_text(encoding="utf-8"))
    assert not evaluation["passed"] and evaluation["champion_version"] == 1
    failure = next(f for f in evaluation["failures"] if f["rule"] == "max_f1_drop" and f["metric"] == "micro_f1")
    assert failure["champion"] - failure["candidate"] > failure["threshold"] == 0.025
    per_label = {f["metric"] for f in evaluation["failures"] if f["rule"] == "max_label_f1_drop"}
    supported = {lbl for lbl in SWITCHED_OFF if evaluation["champion"]["per_label"][lbl]["support"] >= 20}
    assert supported and per_label == {f"label[{lbl}].f1" for lbl in supported}, per_label  # min_label_support 20
    assert all(evaluation["candidate"]["per_label"][lbl]["predicted"] == 0 for lbl in SWITCHED_OFF)
    refused_runs = _mlflow_runs(drill, "failed")
    assert len(refused_runs) == 1 and refused_runs[0].info.status == "FAILED"
    assert refused_runs[0].data.metrics["eval.micro_f1"] < refused_runs[0].data.metrics["eval.champion.micro_f1"]
    artifacts = {a.path for a in _artifacts(drill, refused_runs[0].info.run_id, "quality")}
    assert {"quality/evaluation.json", "quality/bad_cases.tsv", "quality/labels.png"} <= artifacts

    stale = open_release(equal, settings=drill.settings).workspace.root / ".champion-killed"
    stale.mkdir()  # what a run killed while scoring the champion leaves
    second = {r.step: r for r in drill.release(equal, eval_set=str(eval_set))}
    assert not stale.exists() and not list(stale.parent.glob(".champion-*"))
    ev = second["evaluate"].summary
    assert ev["passed"] and ev["champion_version"] == 1 and ev["champion_disagreements"] == 0, ev
    assert ev["micro_f1"] == ev["champion_micro_f1"]
    shadow = second["smoke"].summary["shadow"]  # the live champion and candidate side by side on Triton
    assert shadow["texts"] == 64 and shadow["disagree"] == 0 and shadow["offline_mismatch"] == 0, shadow
    assert shadow["champion_version"] == 1
    drill.assert_invariant(served=2)
    passed = [r for r in _mlflow_runs(drill, "passed") if r.data.tags.get("seqcls.outcome") == "registered"]
    assert len(passed) == 2  # each released version's run holds both gates' evidence


def _artifacts(drill: Drill, run_id: str, path: str) -> list:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=drill.settings.mlflow_tracking_uri).list_artifacts(run_id, path)


def test_evaluate_cli_json_exit_codes_and_a_reduced_precision_profile(
    drill: Drill, good: Path, worse: Path, eval_set: Path, tmp_path: Path
) -> None:
    drill.release(good, eval_set=str(eval_set))
    out = drill.cli("evaluate", "--checkpoint", str(worse), "--eval-set", str(eval_set), "--json")
    assert out.returncode == 1, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["passed"] is False and data["champion"]["micro_f1"] > data["candidate"]["micro_f1"]
    assert set(data["failures"][0]) == {"rule", "metric", "candidate", "champion", "threshold"}
    assert data["eval_set"]["texts"] == 240 and data["eval_set"]["path"] == str(eval_set)
    assert "Quality gate refused" in out.stderr

    broken = tmp_path / "broken.txt"
    broken.write_text("央行宣布降息。\t财经\n某公司发布新品。\t科技##发版\n", encoding="utf-8")
    out = drill.cli("evaluate", "--checkpoint", str(worse), "--eval-set", str(broken), "--json")
    assert out.returncode == 2 and "broken.txt: line 2" in out.stderr and "科技##发布" in out.stderr, out.stderr
    out = drill.cli("release", "--checkpoint", str(worse), "--eval-set", str(broken))
    assert out.returncode == 2 and "broken.txt: line 2" in out.stderr, out.stderr[-2000:]  # bad input: exit 2
    assert "export:" not in out.stderr and "Traceback" not in out.stderr  # refused at resolve, before any step

    out = drill.cli("evaluate", "--checkpoint", str(good), "--eval-set", str(eval_set), "--profile", "int8", "--json")
    assert out.returncode in (0, 1), out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["fp32"] is not None and data["profile"] == "int8"
    profile_checks = [c for c in data["checks"] if c["rule"] == "max_profile_f1_drop"]
    assert {c["metric"] for c in profile_checks} == {"micro_f1", "macro_f1"}
    drop = data["fp32"]["micro_f1"] - data["candidate"]["micro_f1"]
    assert (out.returncode == 0) == all(c["passed"] for c in data["checks"]), (drop, data["failures"])
    drill.assert_invariant(served=1)


def test_the_champion_is_scored_from_its_published_files_or_refused(drill: Drill, good: Path, tmp_path: Path) -> None:
    drill.release(good)
    repo = Repository.from_settings(drill.settings, ModelName("seqcls"))
    graph = served_graph(repo, 1, tmp_path / "scratch")
    assert graph.labels == (good / "label.txt").read_text(encoding="utf-8").split() and graph.version == 1
    onnx = repo.root / repo.names.model / "1" / "model.onnx"
    assert graph.onnx.read_bytes() == onnx.read_bytes() and graph.onnx != onnx  # a verified copy, not the file
    onnx.write_bytes(onnx.read_bytes() + b"\0")
    with pytest.raises(Exception, match="changed since publish"):
        served_graph(repo, 1, tmp_path / "scratch2")


def test_without_a_configured_eval_set_the_checkpoints_own_is_used_and_said(good: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(good, ckpt)
    release = open_release(ckpt)
    assert locate_eval_set(release) is None
    shutil.copy(DEMO_TEST, ckpt / "dev.jsonl")
    (ckpt / "test.txt").write_text("央行宣布降息。\t财经\n", encoding="utf-8")
    path, source = locate_eval_set(release)
    assert path.name == "test.txt" and "checkpoint's own test.txt" in source
    (ckpt / "test.txt").unlink()
    (ckpt / "test.txt").symlink_to(DEMO_TEST)
    with pytest.raises(Exception, match="outside the checkpoint"):
        locate_eval_set(release)
    with pytest.raises(InputError, match="no such file"):
        locate_eval_set(replace(release, config=ReleaseConfig(eval_set=str(tmp_path / "nope.txt"))))


def test_evaluate_scores_the_bytes_resolve_checked_not_the_file_again(
    good: Path, eval_set: Path, tmp_path: Path
) -> None:
    from seqcls.release.kept import kept_eval_set, preflight_eval_set

    mine = tmp_path / "eval.txt"
    shutil.copy(eval_set, mine)
    release = open_release(good, ReleaseConfig(eval_set=str(mine)))
    checked = preflight_eval_set(release)
    changed = "".join(eval_set.read_text(encoding="utf-8").splitlines(keepends=True)[:55])
    mine.write_text(changed, encoding="utf-8")  # changed after it was checked
    kept = kept_eval_set(release)
    assert kept.sha256 == checked.sha256 == hashlib.sha256(eval_set.read_bytes()).hexdigest()
    assert len(kept.texts) == 240 and kept.path == mine
    (copy,) = release.settings.eval_sets_dir.iterdir()  # kept once per home, by content
    copy.write_bytes(copy.read_bytes() + b"x")  # the kept copy damaged: the file as it is now, checked again
    assert len(kept_eval_set(release).texts) == 55
