"""Nothing goes live without its verdicts: gates bound to what is exposed, every override recorded.

Through the real parts as an operator would: a trained demo model and its worse retrain (four labels
never predicted), the demo's held-out texts as the eval set, a real local Triton and MLflow, the CLI
one step at a time. The fast tests below them check the rules on the release parameters.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqcls.airflow.context import config_from_params
from seqcls.config import ReleaseConfig
from seqcls.contract.names import ModelName
from seqcls.errors import GateError, InputError
from seqcls.serving.pins import write_pin
from tests.helpers.demo_models import demo_eval_file, quick_demo_model, worse_retrain
from tests.helpers.drills import Drill, champion

REASON = "accepted: the four switched-off labels are retired this quarter (ticket OPS-42)"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quick_demo_model(tmp_path_factory).path


@pytest.fixture(scope="module")
def worse(good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return worse_retrain(good, tmp_path_factory.mktemp("verdicts") / "worse")


@pytest.fixture(scope="module")
def eval_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_eval_file(tmp_path_factory.mktemp("eval") / "test.txt")


def _served_info(drill: Drill) -> tuple[Path, dict]:
    version = drill.state().serving
    path = drill.repo / "seqcls" / str(version) / "release.json"
    return path, json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.integration
def test_a_refused_checkpoint_cannot_be_walked_live_one_step_at_a_time(
    drill: Drill, good: Path, worse: Path, eval_set: Path
) -> None:
    drill.release(good, eval_set=str(eval_set))
    drill.assert_invariant(served=1)
    with pytest.raises(GateError, match="Quality gate refused"):
        drill.release(worse, eval_set=str(eval_set))
    for step in ("publish", "reload", "smoke", "expose", "promote"):
        out = drill.cli(step, "--checkpoint", str(worse), "--eval-set", str(eval_set))
        assert out.returncode != 0, f"`seqcls {step}` of a refused checkpoint exited 0:\n{out.stderr[-3000:]}"
        assert "Quality gate refused" in out.stderr or "has not run" in out.stderr, out.stderr[-2000:]
    # without its eval set the gate would have nothing to judge on: refused too (the champion was judged on one)
    out = drill.cli("publish", "--checkpoint", str(worse))
    assert out.returncode != 0 and "was judged on an eval set" in out.stderr, out.stderr[-2000:]
    drill.assert_invariant(served=1)
    assert champion(drill.settings) == 1
    sync = drill.cli("sync")
    assert sync.returncode == 0, sync.stdout + sync.stderr


@pytest.mark.slow
@pytest.mark.integration
def test_an_override_is_loud_and_recorded_where_an_auditor_looks(
    drill: Drill, good: Path, worse: Path, eval_set: Path
) -> None:
    from mlflow.tracking import MlflowClient

    drill.release(good, eval_set=str(eval_set))
    out = drill.cli(
        "release", "--checkpoint", str(worse), "--eval-set", str(eval_set), "--override", "quality", "--reason", REASON
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OVERRIDE" in out.stderr and REASON in out.stderr  # said loudly in the release's own log
    drill.assert_invariant(served=2)  # an overridden verdict is a verdict: status and sync agree
    _, info = _served_info(drill)
    quality = info["verdicts"]["quality"]
    assert quality["state"] == "overridden" and quality["override"]["reason"] == REASON
    assert "max_f1_drop on micro_f1" in quality["override"]["verdict"]
    status = drill.cli("status")
    assert status.returncode == 0 and "went live under an override of quality" in status.stdout, status.stdout
    history = drill.cli("history", "--json")
    overrides = [e for e in json.loads(history.stdout)["entries"] if e["kind"] == "override"]
    assert [(e["gate"], e["reason"]) for e in overrides] == [("quality", REASON)], history.stdout[-2000:]
    c = MlflowClient(tracking_uri=drill.settings.mlflow_tracking_uri)
    version = c.get_model_version("seqcls", str(champion(drill.settings)))
    assert version.tags["seqcls.quality"] == "overridden" and version.tags["seqcls.override.quality"] == REASON
    run = c.get_run(version.run_id)
    assert run.data.params["rule.max_f1_drop"] == "0.025"  # the effective rules, as the verdict judged them


@pytest.mark.slow
@pytest.mark.integration
def test_sync_and_status_report_a_served_version_without_verdicts(drill: Drill, good: Path, eval_set: Path) -> None:
    drill.release(good, eval_set=str(eval_set))
    path, info = _served_info(drill)
    info.pop("verdicts")  # what a version put live by a path that skipped the gates looks like
    path.write_text(json.dumps(info, indent=1, ensure_ascii=False), encoding="utf-8")
    version, names = drill.state().serving, ModelName("seqcls").names  # published (and pinned) so
    write_pin(drill.repo, names, version, {m: drill.repo / m / str(version) for m in names.models})
    sync = drill.cli("sync")
    assert sync.returncode != 0 and "went live without passed or overridden verdicts" in sync.stdout, sync.stdout
    status = drill.cli("status")
    assert status.returncode != 0 and "without passed or overridden verdicts" in status.stdout, status.stdout


# ---------------------------------------------------------------------------- the rules on the parameters


@pytest.mark.parametrize(
    ("loosened", "gate"),
    [
        ({"max_f1_drop": 1}, "quality"),
        ({"max_level_f1_drop": None}, "quality"),
        ({"min_eval_texts": 10}, "quality"),
        ({"min_label_support": 100}, "quality"),
        ({"atol": 0.1}, "parity"),
        ({"min_decision_agreement": 0.9}, "parity"),
    ],
)
def test_loosening_a_rule_beyond_its_default_is_an_override(loosened: dict, gate: str) -> None:
    name = next(iter(loosened))
    with pytest.raises(InputError, match=rf"{name}.* loosens the {gate} gate.*--override {gate} --reason"):
        ReleaseConfig(**loosened)
    if loosened[name] is not None:  # (an emptied field in a DAG run's form is the default, not unset)
        with pytest.raises(InputError, match=name):
            config_from_params({name: str(loosened[name])})  # a DAG run's form sends numbers as text
    allowed = ReleaseConfig(**loosened, override=gate, override_reason=REASON)
    assert allowed.overrides == (gate,)
    ReleaseConfig(max_f1_drop=0.01, atol=1e-5, min_eval_texts=100)  # stricter than the defaults: no override


def test_an_override_needs_a_known_gate_and_a_reason() -> None:
    with pytest.raises(InputError, match="override_reason"):
        ReleaseConfig(override="quality")
    with pytest.raises(InputError, match="override: 'smoke' is not a gate"):
        ReleaseConfig(override="smoke", override_reason=REASON)
    with pytest.raises(InputError, match="override_reason is given without an override"):
        ReleaseConfig(override_reason=REASON)
    assert ReleaseConfig(override="parity, quality", override_reason=REASON).overrides == ("parity", "quality")


def test_a_models_file_that_loosens_a_rule_needs_the_override_there_too(tmp_path: Path) -> None:
    from seqcls.airflow.models_file import load_models

    loose = tmp_path / "loose.yaml"
    loose.write_text("models:\n  - name: alpha\n    params: {max_f1_drop: 0.1}\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"loose\.yaml: model 'alpha': params\.max_f1_drop: .*--override quality"):
        load_models(loose)
    given = tmp_path / "given.yaml"
    given.write_text(
        f"models:\n  - name: alpha\n    params: {{max_f1_drop: 0.1, override: quality, override_reason: '{REASON}'}}\n",
        encoding="utf-8",
    )
    (spec,) = load_models(given)
    assert spec.params["override"] == "quality" and spec.params["override_reason"] == REASON
