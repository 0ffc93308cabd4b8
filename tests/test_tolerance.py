"""The parity gate's tolerances agree with one another: a model inside the logit tolerance never
fails on probabilities.

The bug this guards: the old fixed ``prob_atol=1e-5`` rejected models the logit tolerance
accepted (a fresh tiny checkpoint with 23 labels failed validate with logits max |Δ| 4.2e-05 <
atol 1e-4, because probabilities differed by 1.05e-05). Sigmoid's slope is at most 1/4, so the
probability bound is derived, ``(atol + rtol·|x|)/4`` (:mod:`seqcls.gates.parity`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from seqcls.contract import shipped
from seqcls.gates.parity import Tolerance, numeric_report

GATE = Tolerance(1e-4, 1e-3)  # ReleaseConfig's defaults
OLD_PROB_ATOL = 1e-5
MATRICES = 600
LABELS = 23


@pytest.fixture(scope="module")
def decide_mod():
    return shipped.decide()


def _logits(rng: np.random.Generator) -> np.ndarray:
    """Logits as random checkpoints give them: [texts, labels], scale from near-zero to saturated."""
    texts = int(rng.integers(1, 48))
    scale = 10 ** rng.uniform(-3, 2.5)  # 0.001 (fresh random head) … 300 (conftest's logit_scale)
    bias = rng.normal(0, scale / 2)
    return (rng.normal(bias, scale, size=(texts, LABELS))).astype(np.float32)


def _inside(ref: np.ndarray, rng: np.random.Generator, reach: float = 0.99) -> np.ndarray:
    """``ref`` moved anywhere inside ``reach`` × (atol + rtol·|x|), as float32 like the runtimes' outputs.

    30 % of the elements sit at the edge (between ``reach - 2 %`` and ``reach`` of the bound),
    the rest uniform inside.
    """
    bound = GATE.logit_bound(ref.astype(np.float64))
    u = rng.uniform(-1, 1, size=ref.shape)
    edge = rng.random(ref.shape) < 0.3
    u = np.where(edge, np.sign(u) * rng.uniform(reach - 0.02, reach, size=ref.shape), u * reach)
    return (ref.astype(np.float64) + u * bound).astype(np.float32)


def _sweep(decide_mod, reach: float, seed: int = 20240610) -> tuple[list, int, float]:
    """(matrices the gate failed, how many the old rule would have failed, worst |Δp|)."""
    rng = np.random.default_rng(seed)
    failures, old_failures, worst_prob = [], 0, 0.0
    for i in range(MATRICES):
        ref = _logits(rng)
        got = _inside(ref, rng, reach)
        report = numeric_report(ref, got, GATE, decide_mod)
        assert report["logits_out_of_tolerance"] == 0, f"matrix {i}: the perturbation left the logit bound"
        if not report["passed"]:
            failures.append((i, report["prob_max_abs_diff"], report["prob_out_of_tolerance"]))
        old_failures += not _old_rule_passes(ref, got, decide_mod)
        worst_prob = max(worst_prob, report["prob_max_abs_diff"])
    return failures, old_failures, worst_prob


def _old_rule_passes(ref: np.ndarray, got: np.ndarray, decide_mod) -> bool:
    pdiff = np.abs(decide_mod.sigmoid(ref).astype(np.float64) - decide_mod.sigmoid(got))
    return bool(pdiff.max(initial=0.0) <= OLD_PROB_ATOL)


def test_inside_the_logit_tolerance_never_fails_on_probabilities(decide_mod) -> None:
    failures, old_failures, worst_prob = _sweep(decide_mod, reach=0.99)
    share = old_failures / MATRICES
    print(
        f"\n{MATRICES} random logit matrices inside 99 % of atol {GATE.atol} + rtol {GATE.rtol}·|x|: the derived "
        f"gate failed {len(failures)}; the old |Δp| ≤ {OLD_PROB_ATOL} rule would have failed {old_failures} "
        f"({share:.1%}); worst |Δp| {worst_prob:.3g}"
    )
    assert not failures, f"models inside the logit tolerance failed on probabilities: {failures[:5]}"
    assert old_failures > 0, "the perturbations never reach the old rule's limit: this test has no teeth"
    assert worst_prob > OLD_PROB_ATOL


def test_at_the_very_edge_of_the_logit_tolerance_probabilities_still_pass(decide_mod) -> None:
    failures, _, _ = _sweep(decide_mod, reach=0.999)
    assert not failures, f"{len(failures)} of {MATRICES} matrices failed on probabilities: {failures[:3]}"


def test_a_set_prob_atol_is_a_stricter_extra_gate(decide_mod) -> None:
    """``prob_atol`` set by the user tightens the probability gate (and only tightens it)."""
    rng = np.random.default_rng(7)
    ref = (rng.normal(0, 0.5, size=(32, LABELS))).astype(np.float32)  # near 0: sigmoid's steepest part
    got = _inside(ref, rng)
    assert numeric_report(ref, got, GATE, decide_mod)["passed"]
    strict = numeric_report(ref, got, Tolerance(GATE.atol, GATE.rtol, prob_atol=OLD_PROB_ATOL), decide_mod)
    assert strict["logits_out_of_tolerance"] == 0 and strict["prob_out_of_tolerance"] > 0 and not strict["passed"]
    assert strict["prob_tolerance"].startswith("min(")
    loose = Tolerance(GATE.atol, GATE.rtol, prob_atol=1.0)
    assert numeric_report(ref, got, loose, decide_mod)["passed"]
    np.testing.assert_array_equal(loose.prob_bound(ref), GATE.prob_bound(ref))


def test_outside_the_logit_tolerance_still_fails(decide_mod) -> None:
    rng = np.random.default_rng(3)
    ref = _logits(rng)
    got = ref + (2.0 * GATE.logit_bound(ref)).astype(np.float32)
    report = numeric_report(ref, got, GATE, decide_mod)
    assert not report["passed"] and report["logits_out_of_tolerance"] == ref.size


# ----------------------------------------------------------------------------- real checkpoints

TWENTY_THREE = tuple(f"类{i // 4}" if i % 4 == 0 else f"类{i // 4}##子{i}" for i in range(LABELS))
SEEDS = (11, 12, 13, 14, 15)


@pytest.mark.slow
def test_fresh_checkpoints_with_23_labels_pass_every_gate(tmp_path: Path) -> None:
    """Freshly built random checkpoints (the case that used to fail) release through validate."""
    from seqcls.config import ReleaseConfig
    from seqcls.release.intake import open_release
    from seqcls.release.records import ParityReport
    from seqcls.steps import run_release
    from seqcls_tools.testing import build_tiny_checkpoint

    assert len(set(TWENTY_THREE)) == LABELS
    figures = []
    for seed in SEEDS:
        ckpt = build_tiny_checkpoint(tmp_path / f"ckpt{seed}", labels=TWENTY_THREE, seed=seed)
        release = open_release(ckpt, ReleaseConfig())
        results = run_release(release, until="validate")
        assert [r.step for r in results] == ["export", "convert", "validate"]
        assert all(r.status == "ok" for r in results), [r.line() for r in results]
        report = ParityReport.load(release.workspace)
        assert report.passed and not report.gate_errors, report.gate_errors
        assert report.tokenizer["passed"] and report.numeric["passed"] and report.decisions["passed"]
        assert report.numeric["shape"][1] == LABELS
        assert report.numeric["prob_out_of_tolerance"] == 0 and report.numeric["prob_atol"] is None
        figures.append((seed, report.numeric["logits_max_abs_diff"], report.numeric["prob_max_abs_diff"]))
    print("\nseed, logits max |Δ|, prob max |Δ|: " + "; ".join(f"{s} {a:.2g} {p:.2g}" for s, a, p in figures))
