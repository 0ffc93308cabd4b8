"""What a release run logs as MLflow metrics: every measured figure once, not the ones that restate a param or a
count (each metric is rows of MLflow's database kept for ever, once a day on a schedule)."""

from __future__ import annotations

from dataclasses import asdict

from seqcls.gates.metrics import Scores
from seqcls.registry import runs
from seqcls.release.records import NOT_METRICS, ParityReport


def _scores(micro: float) -> Scores:
    level = {"micro_f1": micro, "macro_f1": micro - 0.1}
    return Scores(texts=60, micro_precision=micro, micro_recall=micro, micro_f1=micro, macro_f1=micro - 0.1,
                  sample_accuracy=micro - 0.2, hierarchical_precision=micro, hierarchical_recall=micro,
                  hierarchical_f1=micro, hierarchy_consistency=1.0, per_level={"1": level, "2": level},
                  per_label={"a": {"f1": micro, "support": 10}})  # fmt: skip


def test_the_parity_metrics_leave_out_the_tolerances_the_mode_and_the_repeated_text_counts() -> None:
    report = ParityReport(
        model_name="seqcls",
        fingerprint="f" * 64,
        golden_source="eval set",
        texts=65,
        profile="fp32",
        tokenizer={"texts": 65, "mismatched": 0, "passed": True},
        numeric={"atol": 1e-4, "rtol": 1e-3, "gating": True, "logits_max_abs_diff": 2e-6, "passed": True},
        decisions={"texts": 65, "changed": 0, "agreement": 1.0, "passed": True, "note": "text"},
    )
    metrics = report.metrics()
    assert metrics == {
        "tokenizer.mismatched": 0.0,
        "tokenizer.passed": 1.0,
        "numeric.logits_max_abs_diff": 2e-6,
        "numeric.passed": 1.0,
        "decisions.changed": 0.0,
        "decisions.agreement": 1.0,
        "decisions.passed": 1.0,
        "texts": 65.0,
    }
    assert not NOT_METRICS & set(metrics)


def test_the_champion_s_and_the_fp32_graph_s_figures_are_the_ones_the_rules_compare() -> None:
    evaluation = {"passed": True, "champion_disagreements": 3}
    evaluation |= {"candidate": asdict(_scores(0.9)), "champion": asdict(_scores(0.8)), "fp32": asdict(_scores(0.91))}
    metrics = runs._quality_metrics(evaluation)
    candidate = {k for k in metrics if k.startswith("eval.") and k.count(".") == 1}
    assert {"eval.micro_precision", "eval.hierarchical_f1", "eval.hierarchy_consistency"} <= candidate  # all of it
    for who in ("champion", "fp32"):
        assert {k.removeprefix(f"eval.{who}.") for k in metrics if k.startswith(f"eval.{who}.")} == {
            "micro_f1", "macro_f1", "sample_accuracy", "level_1_micro_f1", "level_1_macro_f1", "level_2_micro_f1",
            "level_2_macro_f1",
        }  # fmt: skip
    assert metrics["eval.champion.micro_f1"] == 0.8 and metrics["eval.champion_disagreements"] == 3.0
