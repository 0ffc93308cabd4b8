"""The quality gate's paired test: a change rule refuses a drop only when it is over the threshold beyond the
noise of the eval set's texts (the drop's lower bound above the threshold), and a verdict says when the eval
set is too small to tell."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqcls.gates.metrics import score
from seqcls.gates.paired import bootstrap, metric_names, paired_counts
from seqcls.gates.rules import Check, QualityRules, judge, judged_labels, paired_test

LABELS = ["体育", "体育##夺冠", "财经", "财经##融资", "组织关系", "组织关系##裁员"]
KINDS = (["体育", "体育##夺冠"], ["财经", "财经##融资"], ["组织关系", "组织关系##裁员"])


def _gold(n: int) -> list[list[str]]:
    return [list(KINDS[i % 3]) for i in range(n)]


def _wrong(rows: list[list[str]], which: list[int]) -> list[list[str]]:
    """``rows`` with the texts at ``which`` answered as the next kind (two misses, two false positives each)."""
    out = [list(r) for r in rows]
    for i in which:
        out[i] = list(KINDS[(KINDS.index(rows[i]) + 1) % 3])
    return out


def _verdict(gold, cand, champ, rules=QualityRules(), **kw):
    c, h = score(gold, cand, LABELS), score(gold, champ, LABELS)
    test = paired_test(gold, cand, champ, LABELS, judged_labels(c, h, rules.min_label_support), **kw)
    return judge(c, h, rules, paired=test), test


def test_a_one_text_difference_on_a_small_set_is_not_a_regression() -> None:
    """Written first, against the gate as it was: on 30 texts the candidate gets one more text wrong than the
    champion (micro-F1 drop 0.033 > 0.025), which scores alone refuse; the paired test cannot tell it from
    noise, so the candidate passes and the verdict says the eval set is too small."""
    gold = _gold(30)
    champ = _wrong(gold, [0])
    cand = _wrong(gold, [0, 1])
    alone = judge(score(gold, cand, LABELS), score(gold, champ, LABELS), QualityRules())
    assert not alone.passed and "micro_f1" in {c.metric for c in alone.failures}  # today's thresholds
    verdict, _ = _verdict(gold, cand, champ)
    assert verdict.passed, verdict.summary()
    micro = next(c for c in verdict.checks if c.rule == "max_f1_drop" and c.metric == "micro_f1")
    assert micro.drop > 0.025 and micro.significant is False and micro.too_small
    assert "the eval set (30 texts) is too small to tell whether the drop is over the threshold" in (verdict.summary())
    assert "max_f1_drop on micro_f1 (95% bounds of the drop" in verdict.summary()


def test_identical_answers_drop_nothing_and_pass() -> None:
    gold = _gold(300)
    answers = _wrong(gold, [3, 50, 120])
    verdict, test = _verdict(gold, answers, answers)
    assert verdict.passed and not verdict.too_small and "too small" not in verdict.summary()
    for name in test.names:
        interval = test.interval(name)
        assert interval.drop == 0 and interval.lower <= 0 <= interval.upper and not interval.significant
    assert all(c.paired and c.lower == c.upper == 0 for c in verdict.checks)


def test_a_real_drop_on_many_texts_is_significant_and_refused() -> None:
    gold = _gold(3000)
    champ = _wrong(gold, list(range(0, 3000, 100)))  # 1 % wrong
    cand = _wrong(gold, list(range(0, 3000, 20)))  # 5 % wrong: micro-F1 0.95 vs 0.99
    verdict, _ = _verdict(gold, cand, champ)
    assert not verdict.passed
    micro = next(c for c in verdict.failures if c.metric == "micro_f1")
    assert micro.significant and micro.lower > 0.025 and not micro.too_small
    assert "over the threshold beyond noise" in micro.describe() and "95% bounds of the drop" in micro.describe()
    assert not verdict.too_small


def test_the_same_drop_on_20_texts_is_not_significant_and_says_the_set_is_too_small() -> None:
    gold = _gold(20)
    champ = _wrong(gold, [0])
    cand = _wrong(gold, [0, 1, 2])  # 10 % more texts wrong: a drop larger than the one refused above
    verdict, _ = _verdict(gold, cand, champ)
    micro = next(c for c in verdict.checks if c.metric == "micro_f1" and c.rule == "max_f1_drop")
    assert micro.drop > 0.05 and micro.lower <= 0 < micro.upper
    assert verdict.passed and micro.too_small, verdict.summary()
    assert "not significantly over the threshold, the eval set is too small to tell" in micro.describe()
    assert "too small" in verdict.summary()


def test_within_the_threshold_but_a_larger_drop_not_excluded_is_too_small() -> None:
    gold = _gold(60)
    champ = _wrong(gold, [0, 1])
    cand = _wrong(gold, [2, 3])  # the same number wrong, other texts: drop 0, but 2 texts either way
    verdict, _ = _verdict(gold, cand, champ)
    accuracy = next(c for c in verdict.checks if c.metric == "sample_accuracy")
    assert accuracy.drop == pytest.approx(0) and accuracy.upper > 0.025
    assert verdict.passed and accuracy.too_small
    assert "cannot be excluded, the eval set is too small" in accuracy.describe()


def test_a_real_but_tolerable_drop_is_not_refused_by_chance() -> None:
    """What the calibration changed: the candidate really is a little worse (18 of 600 texts wrong where the
    champion gets all right: a drop > 0 beyond doubt), and its drop of sample accuracy, 0.03, is over the
    threshold — but not beyond noise: the texts cannot tell it from a drop within the 0.025 tolerance, as
    another training seed shows by chance. A drop over the threshold beyond noise is refused."""
    gold = _gold(600)
    verdict, test = _verdict(gold, _wrong(gold, list(range(0, 600, 34))[:18]), gold)
    accuracy = next(c for c in verdict.checks if c.metric == "sample_accuracy")
    assert accuracy.drop == pytest.approx(0.03) and test.interval("sample_accuracy").significant  # worse, surely
    assert 0 < accuracy.lower <= 0.025 < accuracy.upper and not accuracy.significant and accuracy.too_small
    assert verdict.passed, verdict.summary()
    worse, _ = _verdict(gold, _wrong(gold, list(range(0, 600, 12))), gold)  # 50 texts: 0.083, beyond noise
    assert not worse.passed and next(c for c in worse.failures if c.metric == "sample_accuracy").lower > 0.025


def test_the_observed_metrics_are_the_scores_of_the_gate() -> None:
    rng = np.random.default_rng(3)
    gold = [list(KINDS[k]) for k in rng.integers(0, 3, 400)]
    cand = [sorted(set(g) ^ {LABELS[j] for j in np.flatnonzero(rng.random(6) < 0.04)}) for g in gold]
    champ = [sorted(set(g) ^ {LABELS[j] for j in np.flatnonzero(rng.random(6) < 0.02)}) for g in gold]
    c, h = score(gold, cand, LABELS), score(gold, champ, LABELS)
    test = bootstrap(paired_counts(gold, cand, champ, LABELS), judged=LABELS, resamples=50)
    for who, s, observed in (("candidate", c, test.observed_candidate), ("champion", h, test.observed_champion)):
        expected = [s.micro_f1, s.macro_f1, s.sample_accuracy]
        expected += [s.per_level[lv][m] for lv in ("1", "2") for m in ("micro_f1", "macro_f1")]
        expected += [s.per_label[lbl]["f1"] for lbl in LABELS]
        assert observed == pytest.approx(expected), who
    assert test.names == metric_names(LABELS, LABELS)


def test_deterministic_and_chunking_changes_nothing() -> None:
    gold = _gold(500)
    counts = paired_counts(gold, _wrong(gold, list(range(0, 500, 7))), _wrong(gold, list(range(0, 500, 11))), LABELS)
    whole = bootstrap(counts, resamples=300, chunk=300)
    chunked = bootstrap(counts, resamples=300, chunk=7)
    again = bootstrap(counts, resamples=300)
    other = bootstrap(counts, resamples=300, seed=1)
    assert np.array_equal(whole.candidate, chunked.candidate) and np.array_equal(whole.champion, chunked.champion)
    assert np.array_equal(whole.candidate, again.candidate)
    assert not np.array_equal(whole.candidate, other.candidate)
    assert counts.patterns <= 12 and counts.texts == 500  # texts answered alike are merged


def test_the_evidence_carries_the_interval_and_the_failure_keeps_its_shape() -> None:
    gold = _gold(3000)
    verdict, test = _verdict(gold, _wrong(gold, list(range(0, 3000, 20))), gold)
    failure = verdict.failures[0]
    assert set(failure.failure()) == {"rule", "metric", "candidate", "champion", "threshold"}
    evidence = failure.evidence()
    assert evidence["significant"] is True and evidence["lower"] <= evidence["drop"] <= evidence["upper"]
    as_dict = json.loads(json.dumps(verdict.to_dict()))
    assert as_dict["paired"] == test.summary() | {"method": "paired bootstrap"}
    assert as_dict["paired"]["resamples"] == 2000 and as_dict["paired"]["confidence"] == 0.95
    plain = Check("max_f1_drop", "macro_f1", 0.5, 0.6, 0.02, False)
    assert not plain.paired and plain.significant is None and not plain.too_small and plain.interval() == ""


def test_relative_rule_and_confidence() -> None:
    gold = _gold(3000)
    cand, champ = _wrong(gold, list(range(0, 3000, 20))), _wrong(gold, list(range(0, 3000, 100)))
    rules = QualityRules(max_f1_drop=None, max_f1_drop_relative=0.02)
    verdict, _ = _verdict(gold, cand, champ, rules)
    relative = next(c for c in verdict.failures if c.rule == "max_f1_drop_relative" and c.metric == "micro_f1")
    assert relative.significant and "relative drop" in relative.describe() and "%…" in relative.describe()
    loose, _ = _verdict(gold, cand, champ, rules, confidence=0.999)
    wide = next(c for c in loose.checks if c.rule == "max_f1_drop_relative" and c.metric == "micro_f1")
    assert wide.lower < relative.lower and wide.upper > relative.upper


def test_scores_alone_keep_the_thresholds() -> None:
    """Without per-text answers (scores only, e.g. stored ones) a change rule is the plain threshold."""
    gold = _gold(30)
    verdict = judge(score(gold, _wrong(gold, [1, 2]), LABELS), score(gold, gold, LABELS), QualityRules())
    assert not verdict.passed and verdict.paired is None
    assert all(not c.paired for c in verdict.checks) and "bounds" not in verdict.summary()


def test_bad_inputs() -> None:
    gold = _gold(10)
    with pytest.raises(ValueError, match="the same texts"):
        paired_counts(gold, gold[:9], gold, LABELS)
    counts = paired_counts(gold, gold, gold, LABELS)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap(counts, confidence=0.4)
    with pytest.raises(ValueError, match="not in the paired counts"):
        bootstrap(counts, judged=["nope"])
    with pytest.raises(ValueError, match="the paired test on 10"):
        s = score(gold[:9], gold[:9], LABELS)
        judge(s, s, QualityRules(), paired=bootstrap(counts, resamples=10))


def _evidence_page(tmp_path, gold, cand, champ, *, paired: bool = True) -> tuple[dict, str]:
    """evaluate's own ``write_evidence`` on hand-made answers, then the quality page rendered from the files."""
    from types import SimpleNamespace

    from seqcls.airflow.pages.quality import quality_evidence, render_quality
    from seqcls.contract.names import ModelName
    from seqcls.gates.evalset import EvalSet
    from seqcls.gates.scoring import Predictions
    from seqcls.release.records import OUT_DIRS
    from seqcls.release.workspace import Workspace
    from seqcls.steps.evaluate import write_evidence

    ws = Workspace(tmp_path / "ws")
    out = ws.failed_dir("evaluate")
    out.mkdir(parents=True)
    texts = tuple(f"第{i}条" for i in range(len(gold)))
    es = EvalSet(tmp_path / "eval.tsv", "cd" * 32, "tsv", "configured", texts, tuple(map(tuple, gold)))

    def predictions(name: str, rows: list[list[str]]) -> Predictions:
        probs = np.array([[0.9 if lbl in row else 0.1 for lbl in LABELS] for row in rows])
        return Predictions(name, rows, probs, LABELS, 0.01, "fp32")

    answers = {"candidate": predictions("candidate", cand), "champion": predictions("champion", champ)}
    scores = {name: score(gold, p.labels, LABELS) for name, p in answers.items()}
    test = paired_test(gold, cand, champ, LABELS, judged_labels(scores["candidate"], scores["champion"], 20))
    verdict = judge(scores["candidate"], scores["champion"], QualityRules(), paired=test if paired else None)
    release = SimpleNamespace(
        config=SimpleNamespace(model_name=ModelName("news"), profile="fp32"),
        checkpoint=SimpleNamespace(fingerprint="ab" * 32, short_fingerprint="abababababab"),
    )
    evaluation = write_evidence(release, es, answers, scores, verdict, 3, out)  # type: ignore[arg-type]
    ws.record("evaluate", {"status": "ok" if verdict.passed else "failed", "error": "refused"})
    if verdict.passed:  # a passed gate's evidence lives in quality/
        out.rename(ws.path(OUT_DIRS["evaluate"]))
    found = quality_evidence(ws.root)
    return evaluation, render_quality(found, dag_id="d", run_id="r", links=[], base="r")


def test_evaluation_json_and_the_page_show_each_drops_interval_and_a_too_small_set(tmp_path) -> None:
    gold = _gold(30)
    evaluation, page = _evidence_page(tmp_path, gold, _wrong(gold, [0, 1]), _wrong(gold, [0]))
    assert evaluation["passed"] and evaluation["paired"]["texts"] == 30 and evaluation["too_small"]
    micro = next(c for c in evaluation["checks"] if c["rule"] == "max_f1_drop" and c["metric"] == "micro_f1")
    assert micro["passed"] and micro["significant"] is False and micro["too_small"] is True
    assert micro["lower"] <= micro["drop"] <= micro["upper"]
    assert "too small to tell whether the drop is over the threshold" in evaluation["summary"]
    assert (
        "Quality gate passed" in page
        and "The eval set is too small to tell whether the drop is over the threshold" in page
    )
    headline = page[page.index("<table class='headline'>") : page.index("</table>", page.index("class='headline'"))]
    assert "drop, 95% bounds</th>" in headline and f"{micro['lower']:.4f} … {micro['upper']:.4f}" in headline
    assert "not beyond noise; eval set too small" in headline
    assert "Drops judged as paired data: paired bootstrap over the 30 texts (2000 resamples" in page


def test_a_refused_gate_page_shows_the_failures_bounds(tmp_path) -> None:
    gold = _gold(600)
    evaluation, page = _evidence_page(tmp_path, gold, _wrong(gold, list(range(0, 600, 10))), gold)
    assert not evaluation["passed"] and set(evaluation["failures"][0]) == {
        "rule",
        "metric",
        "candidate",
        "champion",
        "threshold",
    }
    failures = page[page.index("<table class='failures'>") : page.index("</table>", page.index("class='failures'"))]
    assert "Quality gate REFUSED" in page and "<td>over the threshold beyond noise</td>" in failures
    _, alone = _evidence_page(tmp_path / "alone", gold, _wrong(gold, [1, 2]), gold, paired=False)
    assert "Judged on the scores alone" in alone and "drop, 95% bounds</th><th></th><th>fp32" not in alone


def test_memory_stays_bounded_at_the_largest_eval_set() -> None:
    """200,000 texts (SEQCLS_EVAL_SET_MAX_TEXTS), 2,000 resamples: a dense weight matrix alone would be 3.2 GB;
    texts answered alike are merged and the weights come in blocks, so the test stays within tens of MB."""
    import tracemalloc

    base = _gold(2000)
    cand, champ = _wrong(base, list(range(0, 2000, 37))), _wrong(base, list(range(5, 2000, 53)))
    gold, cand, champ = base * 100, cand * 100, champ * 100
    tracemalloc.start()
    test = bootstrap(paired_counts(gold, cand, champ, LABELS), judged=LABELS)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert test.texts == 200_000 and test.resamples == 2000 and test.patterns < 20
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.1f} MB"
