"""The quality gate's rules and its verdict: may this candidate replace the champion?

A retrained model can pass every parity check (its graph computes what its checkpoint computes)
and still be worse than the model it replaces. Three kinds of rule, all on :class:`Scores` of the
same eval set:

- **floors** (``min_micro_f1``, ``min_macro_f1``) apply to every release, the first one too;
- **change rules** compare with the served champion: the absolute and relative drop of micro-F1,
  macro-F1 and sample accuracy, of each hierarchy level's micro-/macro-F1, and of each label's F1
  for labels with enough gold texts to make its F1 more than noise (``min_label_support``);
- the **profile rule** compares a reduced-precision profile (``fp32-fused``, ``int8``) with the fp32
  graph of the same checkpoint: quantization may cost a little, never more than
  ``max_profile_f1_drop``.

A drop is ``baseline - candidate`` (positive = worse) and passes while it is at most the threshold
(plus 1e-12, so equal scores never fail on float rounding). A NaN score fails every rule it meets.

**Evidence, not only size.** With both models' answers per text (:mod:`seqcls.gates.paired`: a
paired bootstrap over the eval set's texts), a change rule refuses only when the drop exceeds its
threshold *beyond noise*: the one-sided lower bound of the drop is above the threshold. On a small eval
set one or two texts can move a metric past a fixed threshold, and that says nothing about the model.
Why the threshold and not 0: a retrain that is truly a little worse, within the tolerance (another
training seed), shows a significant drop > 0 on a few hundred texts whenever chance pushes the observed
drop past the threshold — calibrated on the demo model's seeds, "over the threshold and significantly
above 0" refused 18 of 400 such comparisons on 100-text draws, "significantly above the threshold" none,
while refusing the quick retrain on every draw (the figures: docs/performance.md). Each compared metric
carries its interval; a check whose interval straddles the threshold (the eval set cannot tell whether
the drop is above or below it) says the eval set is too small for it, in the check and in the verdict's
summary. Without per-text answers (scores alone) the rules are thresholds, as they always were. Floors
and the profile rule (a graph against its own fp32 graph: deterministic answers) stay thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from seqcls.config import ReleaseConfig
from seqcls.errors import InputError
from seqcls.gates.metrics import Scores
from seqcls.gates.paired import CONFIDENCE, RESAMPLES, SEED, Interval, PairedTest, bootstrap, paired_counts

EPSILON = 1e-12
#: The overall metrics the change rules compare.
OVERALL = ("micro_f1", "macro_f1", "sample_accuracy")
#: The metrics the level and profile rules compare.
F1S = ("micro_f1", "macro_f1")
CHANGE_RULES = ("max_f1_drop", "max_f1_drop_relative", "max_level_f1_drop", "max_label_f1_drop")
FIRST_RELEASE = "change rules skipped: no champion is served yet (first release)"
FP32_ITSELF = "profile rule skipped: the candidate is the fp32 graph"


@dataclass(frozen=True)
class QualityRules:
    """Thresholds of the gate (``None`` turns a rule off); defaults are the release config's."""

    min_micro_f1: float | None = ReleaseConfig.min_micro_f1
    min_macro_f1: float | None = ReleaseConfig.min_macro_f1
    max_f1_drop: float | None = ReleaseConfig.max_f1_drop
    max_f1_drop_relative: float | None = ReleaseConfig.max_f1_drop_relative
    max_level_f1_drop: float | None = ReleaseConfig.max_level_f1_drop
    max_label_f1_drop: float | None = ReleaseConfig.max_label_f1_drop
    min_label_support: int = ReleaseConfig.min_label_support
    max_profile_f1_drop: float | None = ReleaseConfig.max_profile_f1_drop

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "min_label_support":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise InputError(f"quality rule min_label_support is {value!r}: expected an integer >= 1.")
            elif value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1
            ):
                raise InputError(f"quality rule {f.name} is {value!r}: expected a number from 0 to 1, or null (off).")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> QualityRules:
        """The rules among ``values`` (a release config's ``to_dict()``); other keys are ignored.

        ``min_label_support: None`` keeps the default (it is a count, not a rule that can be off).
        """
        known = {f.name for f in fields(cls)}
        picked = {k: v for k, v in values.items() if k in known}
        if picked.get("min_label_support", 0) is None:
            del picked["min_label_support"]
        return cls(**picked)


@dataclass
class Check:
    """One comparison: ``metric`` of the candidate against a floor (``baseline`` None) or a baseline.

    A change rule judged with the paired test also carries the bounds of its drop (``lower``/``upper``,
    each one-sided at ``confidence``; relative for ``max_f1_drop_relative``); None otherwise. It fails only
    when the lower bound is above the threshold (:attr:`significant`)."""

    rule: str
    metric: str
    candidate: float
    baseline: float | None
    threshold: float
    passed: bool
    lower: float | None = None
    upper: float | None = None
    confidence: float | None = None

    @property
    def paired(self) -> bool:
        """Whether the paired test judged this check (it has an interval)."""
        return self.lower is not None and self.upper is not None

    @property
    def significant(self) -> bool | None:
        """The drop is above the threshold beyond the noise of resampling the texts (lower bound > threshold);
        None without an interval."""
        return None if self.lower is None else self.lower > self.threshold + EPSILON

    @property
    def too_small(self) -> bool:
        """The eval set cannot tell whether the drop is above or below the threshold: its interval straddles it."""
        if not self.paired:
            return False
        assert self.lower is not None and self.upper is not None
        return self.lower <= self.threshold + EPSILON < self.upper

    @property
    def drop(self) -> float | None:
        """``baseline - candidate`` (relative to the baseline for ``max_f1_drop_relative``); None for a floor."""
        if self.baseline is None:
            return None
        drop = self.baseline - self.candidate
        return drop / self.baseline if self.rule == "max_f1_drop_relative" else drop

    def failure(self) -> dict[str, Any]:
        """The check as a refusal names it; for the profile rule ``champion`` is the fp32 graph's value."""
        return {
            "rule": self.rule,
            "metric": self.metric,
            "candidate": self.candidate,
            "champion": self.baseline,
            "threshold": self.threshold,
        }

    def evidence(self) -> dict[str, Any]:
        """:meth:`failure` plus the outcome and, when the paired test judged it, the drop's interval."""
        out = self.failure() | {"passed": self.passed}
        if self.paired:
            out |= {
                "drop": self.drop,
                "lower": self.lower,
                "upper": self.upper,
                "confidence": self.confidence,
                "significant": self.significant,
                "too_small": self.too_small,
            }
        return out

    def _amount(self, value: float) -> str:
        return f"{value:.2%}" if self.rule == "max_f1_drop_relative" else f"{value:.3g}"

    def interval(self) -> str:
        """``95% bounds of the drop -0.004…0.012`` (empty without the paired test)."""
        if not self.paired:
            return ""
        assert self.lower is not None and self.upper is not None and self.confidence is not None
        return f"{self.confidence:.0%} bounds of the drop {self._amount(self.lower)}…{self._amount(self.upper)}"

    def describe(self) -> str:
        """``max_f1_drop on micro_f1: candidate 0.657 vs champion 0.993 (drop 0.336 > 0.02)``; judged with the
        paired test, the drop's bounds follow, and whether it is over the threshold beyond noise or the eval set
        too small to tell."""
        head = f"{self.rule} on {self.metric}: candidate {self.candidate:.4g}"
        if self.baseline is None:
            return f"{head} {'>=' if self.passed else '<'} {self.threshold:.3g}"
        versus = "fp32" if self.rule == "max_profile_f1_drop" else "champion"
        drop = self.drop
        assert drop is not None
        over = not drop <= self.threshold + EPSILON
        relation = ">" if over else "<="
        what = "relative drop" if self.rule == "max_f1_drop_relative" else "drop"
        change = f"{what} {self._amount(drop)} {relation} {self._amount(self.threshold)}"
        if self.paired:
            change += f"; {self.interval()}"
            if over and self.significant:
                change += ", over the threshold beyond noise"
            elif over:
                change += ": not significantly over the threshold, the eval set is too small to tell it from noise"
            elif self.too_small:
                change += f": a drop over {self._amount(self.threshold)} cannot be excluded, the eval set is too small"
        return f"{head} vs {versus} {self.baseline:.4g} ({change})"


@dataclass
class Verdict:
    """The gate's answer: passed only when no check failed (skipped rules are listed, never silent)."""

    passed: bool
    checks: list[Check]
    failures: list[Check]
    skipped: list[str]
    #: How the paired test ran (:meth:`PairedTest.summary`); None: judged on scores alone, thresholds only.
    paired: dict[str, Any] | None = None

    @property
    def too_small(self) -> list[Check]:
        """The checks whose drop the eval set cannot tell from noise at the threshold's size."""
        return [c for c in self.checks if c.too_small]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "summary": self.summary(),
            "checks": [asdict(c) for c in self.checks],
            "failures": [c.failure() for c in self.failures],
            "skipped": list(self.skipped),
            "paired": self.paired,
            "too_small": [c.describe() for c in self.too_small],
        }

    def too_small_note(self) -> str | None:
        """``the eval set (40 texts) is too small to tell whether the drop is over the threshold for 2 of 9
        compared metrics: …`` — None when it is large enough for every check (or no paired test ran)."""
        small = self.too_small
        if not small:
            return None
        compared = sum(1 for c in self.checks if c.paired)
        texts = f" ({self.paired['texts']} texts)" if self.paired else ""
        named = ", ".join(f"{c.rule} on {c.metric} ({c.interval()})" for c in small)
        return (
            f"the eval set{texts} is too small to tell whether the drop is over the threshold for "
            f"{len(small)} of {compared} compared metrics: {named}"
        )

    def summary(self) -> str:
        """One line: ``passed: 14 checks`` (and what was skipped) or ``refused: <each failure>; …``, then
        the checks the eval set is too small for (paired test only)."""
        note = self.too_small_note()
        if not self.passed:
            return "; ".join(["refused: " + "; ".join(c.describe() for c in self.failures), *([note] if note else [])])
        line = f"passed: {len(self.checks)} check{'' if len(self.checks) == 1 else 's'}"
        return "; ".join([line, *self.skipped, *([note] if note else [])])


def _floor(rule: str, metric: str, value: float, threshold: float) -> Check:
    return Check(rule, metric, value, None, threshold, value >= threshold - EPSILON)


def _drop(
    rule: str, metric: str, value: float, baseline: float, threshold: float, paired: PairedTest | None = None
) -> Check:
    within = baseline - value <= threshold + EPSILON
    return _judged(Check(rule, metric, value, baseline, threshold, within), paired)


def _relative(metric: str, value: float, baseline: float, threshold: float, paired: PairedTest | None) -> Check:
    passed = (baseline - value) / baseline <= threshold + EPSILON
    return _judged(Check("max_f1_drop_relative", metric, value, baseline, threshold, passed), paired)


def _judged(check: Check, paired: PairedTest | None) -> Check:
    """With the paired test: the drop's interval, and a drop over the threshold refuses only when it is over
    the threshold beyond noise (its lower bound above the threshold)."""
    if paired is None or check.metric not in paired:
        return check
    interval: Interval = paired.interval(check.metric, relative=check.rule == "max_f1_drop_relative")
    check.lower, check.upper, check.confidence = interval.lower, interval.upper, interval.confidence
    check.passed = check.passed or not check.significant
    return check


def _floors(candidate: Scores, rules: QualityRules) -> list[Check]:
    pairs = (("min_micro_f1", "micro_f1", rules.min_micro_f1), ("min_macro_f1", "macro_f1", rules.min_macro_f1))
    return [_floor(rule, metric, getattr(candidate, metric), t) for rule, metric, t in pairs if t is not None]


def _overall(
    candidate: Scores, champion: Scores, rules: QualityRules, skipped: list[str], paired: PairedTest | None
) -> list[Check]:
    checks = []
    for metric in OVERALL:
        value, baseline = getattr(candidate, metric), getattr(champion, metric)
        if rules.max_f1_drop is not None:
            checks.append(_drop("max_f1_drop", metric, value, baseline, rules.max_f1_drop, paired))
        if rules.max_f1_drop_relative is None:
            continue
        if baseline > 0 or math.isnan(baseline):  # a NaN champion fails closed, like a NaN candidate
            checks.append(_relative(metric, value, baseline, rules.max_f1_drop_relative, paired))
        else:
            skipped.append(f"max_f1_drop_relative on {metric} skipped: the champion's {metric} is 0")
    return checks


def _levels(candidate: Scores, champion: Scores, threshold: float, paired: PairedTest | None) -> list[Check]:
    checks = []
    for level in sorted(candidate.per_level.keys() & champion.per_level.keys(), key=int):
        for metric in F1S:
            value, baseline = candidate.per_level[level][metric], champion.per_level[level][metric]
            checks.append(_drop("max_level_f1_drop", f"level_{level}.{metric}", value, baseline, threshold, paired))
    return checks


def judged_labels(candidate: Scores, champion: Scores, support: int) -> list[str]:
    """The labels the per-label rule compares: both models score them, with at least ``support`` gold texts."""
    shared = [lbl for lbl in candidate.per_label if lbl in champion.per_label]
    return [lbl for lbl in shared if candidate.per_label[lbl]["support"] >= support]


def _labels(
    candidate: Scores, champion: Scores, threshold: float, support: int, skipped: list[str], paired: PairedTest | None
) -> list[Check]:
    """Labels both models score with at least ``support`` gold texts (fewer: one text moves F1 too much)."""
    gated = judged_labels(candidate, champion, support)
    if not gated:
        skipped.append(
            f"max_label_f1_drop skipped: no label has {support} or more gold texts in the eval set (min_label_support)"
        )
    checks = []
    for lbl in gated:
        value, baseline = candidate.per_label[lbl]["f1"], champion.per_label[lbl]["f1"]
        checks.append(_drop("max_label_f1_drop", f"label[{lbl}].f1", value, baseline, threshold, paired))
    return checks


def _same_set(candidate: Scores, other: Scores, who: str) -> None:
    if other.texts != candidate.texts:
        raise ValueError(f"candidate scored on {candidate.texts} texts, the {who} on {other.texts}: not the same set")


def judge(
    candidate: Scores,
    champion: Scores | None,
    rules: QualityRules,
    *,
    fp32: Scores | None = None,
    paired: PairedTest | None = None,
) -> Verdict:
    """Apply ``rules`` to the candidate's scores: floors always, change rules against ``champion`` (None on a
    first release), the profile rule against ``fp32`` (the fp32 graph's scores when the candidate is a
    reduced-precision profile). All scores must come from the same eval set.

    ``paired``: the paired test of candidate against champion on that set (:func:`paired_test`); with it a
    change rule refuses only a drop over its threshold beyond noise, without it (scores alone) any drop over."""
    skipped: list[str] = []
    checks = _floors(candidate, rules)
    change_rules_on = any(getattr(rules, name) is not None for name in CHANGE_RULES)
    if champion is None:
        if change_rules_on:
            skipped.append(FIRST_RELEASE)
    else:
        _same_set(candidate, champion, "champion")
        if paired is not None and paired.texts != candidate.texts:
            raise ValueError(f"candidate scored on {candidate.texts} texts, the paired test on {paired.texts}")
        checks += _overall(candidate, champion, rules, skipped, paired)
        if rules.max_level_f1_drop is not None:
            checks += _levels(candidate, champion, rules.max_level_f1_drop, paired)
        if rules.max_label_f1_drop is not None:
            checks += _labels(candidate, champion, rules.max_label_f1_drop, rules.min_label_support, skipped, paired)
    if rules.max_profile_f1_drop is not None:
        if fp32 is None:
            skipped.append(FP32_ITSELF)
        else:
            _same_set(candidate, fp32, "fp32 graph")
            for metric in F1S:
                value, baseline = getattr(candidate, metric), getattr(fp32, metric)
                checks.append(_drop("max_profile_f1_drop", metric, value, baseline, rules.max_profile_f1_drop))
    failures = [c for c in checks if not c.passed]
    summary = paired.summary() if paired is not None and champion is not None else None
    return Verdict(passed=not failures, checks=checks, failures=failures, skipped=skipped, paired=summary)


def paired_test(
    gold: Sequence[Sequence[str]],
    candidate: Sequence[Sequence[str]],
    champion: Sequence[Sequence[str]],
    labels: Sequence[str],
    judged: Sequence[str],
    *,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> PairedTest:
    """The paired bootstrap of candidate against champion on the same texts (label sets per text), with the
    F1 of each label in ``judged`` (:func:`judged_labels`) beside the overall and per-level metrics."""
    counts = paired_counts(gold, candidate, champion, labels)
    return bootstrap(counts, judged=judged, resamples=resamples, confidence=confidence, seed=seed)
