"""The paired quality gate on real demo models: retrains that differ only by their training seed pass
against each other, a clearly worse one (four labels never predicted) is refused — on the demo's held-out
texts, answered by each checkpoint as the demo scores it."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqcls.gates.metrics import score
from seqcls.gates.rules import QualityRules, judge, judged_labels, paired_test
from seqcls_tools.bench.paired_calibration import demo_answers
from seqcls_tools.demo import LABELS, load_split
from tests.helpers.demo_models import quick_demo_model, worse_retrain

pytestmark = pytest.mark.slow

SEEDS = (0, 1, 2)


def _verdict(gold, cand, champ):
    c, h = score(gold, cand, LABELS), score(gold, champ, LABELS)
    rules = QualityRules()
    test = paired_test(gold, cand, champ, LABELS, judged_labels(c, h, rules.min_label_support))
    return judge(c, h, rules, paired=test)


def test_equal_seeds_pass_and_a_worse_retrain_is_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    rows = load_split("test")  # 240 texts no model trained on
    texts, gold = [r["text"] for r in rows], [r["labels"] for r in rows]
    models = {seed: quick_demo_model(tmp_path_factory, seed=seed).path for seed in SEEDS}
    worse = worse_retrain(models[0], Path(tmp_path_factory.mktemp("worse")) / "ckpt")
    answers = {seed: demo_answers(path, texts) for seed, path in models.items()}
    for champ in SEEDS:
        for cand in SEEDS:
            if cand != champ:
                verdict = _verdict(gold, answers[cand], answers[champ])
                assert verdict.passed, (cand, champ, verdict.summary())
    refused = _verdict(gold, demo_answers(worse, texts), answers[0])
    assert not refused.passed, refused.summary()
    micro = next(c for c in refused.failures if c.metric == "micro_f1")
    assert micro.significant and micro.lower > 0, micro.describe()
