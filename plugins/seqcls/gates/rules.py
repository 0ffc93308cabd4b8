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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from seqcls.config import ReleaseConfig
from seqcls.errors import InputError
from seqcls.gates.metrics import Scores

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
    """One comparison: ``metric`` of the candidate against a floor (``baseline`` None) or a baseline."""

    rule: str
    metric: str
    candidate: float
    baseline: float | None
    threshold: float
    passed: bool

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

    def describe(self) -> str:
        """``max_f1_drop on micro_f1: candidate 0.657 vs champion 0.993 (drop 0.336 > 0.02)``."""
        head = f"{self.rule} on {self.metric}: candidate {self.candidate:.4g}"
        if self.baseline is None:
            return f"{head} {'>=' if self.passed else '<'} {self.threshold:.3g}"
        versus = "fp32" if self.rule == "max_profile_f1_drop" else "champion"
        relation = "<=" if self.passed else ">"
        if self.rule == "max_f1_drop_relative":
            change = f"relative drop {self.drop:.2%} {relation} {self.threshold:.2%}"
        else:
            change = f"drop {self.drop:.3g} {relation} {self.threshold:.3g}"
        return f"{head} vs {versus} {self.baseline:.4g} ({change})"


@dataclass
class Verdict:
    """The gate's answer: passed only when no check failed (skipped rules are listed, never silent)."""

    passed: bool
    checks: list[Check]
    failures: list[Check]
    skipped: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "summary": self.summary(),
            "checks": [asdict(c) for c in self.checks],
            "failures": [c.failure() for c in self.failures],
            "skipped": list(self.skipped),
        }

    def summary(self) -> str:
        """One line: ``passed: 14 checks`` (and what was skipped) or ``refused: <each failure>; …``."""
        if not self.passed:
            return "refused: " + "; ".join(c.describe() for c in self.failures)
        line = f"passed: {len(self.checks)} check{'' if len(self.checks) == 1 else 's'}"
        return "; ".join([line, *self.skipped])


def _floor(rule: str, metric: str, value: float, threshold: float) -> Check:
    return Check(rule, metric, value, None, threshold, value >= threshold - EPSILON)


def _drop(rule: str, metric: str, value: float, baseline: float, threshold: float) -> Check:
    return Check(rule, metric, value, baseline, threshold, baseline - value <= threshold + EPSILON)


def _relative(metric: str, value: float, baseline: float, threshold: float) -> Check:
    passed = (baseline - value) / baseline <= threshold + EPSILON
    return Check("max_f1_drop_relative", metric, value, baseline, threshold, passed)


def _floors(candidate: Scores, rules: QualityRules) -> list[Check]:
    pairs = (("min_micro_f1", "micro_f1", rules.min_micro_f1), ("min_macro_f1", "macro_f1", rules.min_macro_f1))
    return [_floor(rule, metric, getattr(candidate, metric), t) for rule, metric, t in pairs if t is not None]


def _overall(candidate: Scores, champion: Scores, rules: QualityRules, skipped: list[str]) -> list[Check]:
    checks = []
    for metric in OVERALL:
        value, baseline = getattr(candidate, metric), getattr(champion, metric)
        if rules.max_f1_drop is not None:
            checks.append(_drop("max_f1_drop", metric, value, baseline, rules.max_f1_drop))
        if rules.max_f1_drop_relative is None:
            continue
        if baseline > 0 or math.isnan(baseline):  # a NaN champion fails closed, like a NaN candidate
            checks.append(_relative(metric, value, baseline, rules.max_f1_drop_relative))
        else:
            skipped.append(f"max_f1_drop_relative on {metric} skipped: the champion's {metric} is 0")
    return checks


def _levels(candidate: Scores, champion: Scores, threshold: float) -> list[Check]:
    checks = []
    for level in sorted(candidate.per_level.keys() & champion.per_level.keys(), key=int):
        for metric in F1S:
            value, baseline = candidate.per_level[level][metric], champion.per_level[level][metric]
            checks.append(_drop("max_level_f1_drop", f"level_{level}.{metric}", value, baseline, threshold))
    return checks


def _labels(candidate: Scores, champion: Scores, threshold: float, support: int, skipped: list[str]) -> list[Check]:
    """Labels both models score with at least ``support`` gold texts (fewer: one text moves F1 too much)."""
    shared = [lbl for lbl in candidate.per_label if lbl in champion.per_label]
    gated = [lbl for lbl in shared if candidate.per_label[lbl]["support"] >= support]
    if not gated:
        skipped.append(
            f"max_label_f1_drop skipped: no label has {support} or more gold texts in the eval set (min_label_support)"
        )
    checks = []
    for lbl in gated:
        value, baseline = candidate.per_label[lbl]["f1"], champion.per_label[lbl]["f1"]
        checks.append(_drop("max_label_f1_drop", f"label[{lbl}].f1", value, baseline, threshold))
    return checks


def _same_set(candidate: Scores, other: Scores, who: str) -> None:
    if other.texts != candidate.texts:
        raise ValueError(f"candidate scored on {candidate.texts} texts, the {who} on {other.texts}: not the same set")


def judge(candidate: Scores, champion: Scores | None, rules: QualityRules, *, fp32: Scores | None = None) -> Verdict:
    """Apply ``rules`` to the candidate's scores: floors always, change rules against ``champion`` (None on a
    first release), the profile rule against ``fp32`` (the fp32 graph's scores when the candidate is a
    reduced-precision profile). All scores must come from the same eval set."""
    skipped: list[str] = []
    checks = _floors(candidate, rules)
    change_rules_on = any(getattr(rules, name) is not None for name in CHANGE_RULES)
    if champion is None:
        if change_rules_on:
            skipped.append(FIRST_RELEASE)
    else:
        _same_set(candidate, champion, "champion")
        checks += _overall(candidate, champion, rules, skipped)
        if rules.max_level_f1_drop is not None:
            checks += _levels(candidate, champion, rules.max_level_f1_drop)
        if rules.max_label_f1_drop is not None:
            checks += _labels(candidate, champion, rules.max_label_f1_drop, rules.min_label_support, skipped)
    if rules.max_profile_f1_drop is not None:
        if fp32 is None:
            skipped.append(FP32_ITSELF)
        else:
            _same_set(candidate, fp32, "fp32 graph")
            for metric in F1S:
                value, baseline = getattr(candidate, metric), getattr(fp32, metric)
                checks.append(_drop("max_profile_f1_drop", metric, value, baseline, rules.max_profile_f1_drop))
    failures = [c for c in checks if not c.passed]
    return Verdict(passed=not failures, checks=checks, failures=failures, skipped=skipped)
