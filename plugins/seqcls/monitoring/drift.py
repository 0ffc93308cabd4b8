"""Has what the served version predicts drifted from its release's reference? Pure statistics.

Why two tests per label: the population-stability index (PSI) says whether a shift is *large*
enough to matter, a two-proportion z-test whether it is *real* rather than the noise of a few
hundred texts (PSI of two small samples is biased upwards). A label drifts only when both say so
and its counts are large enough for either to mean something; too little traffic is its own
answer, never "no drift". The labels are not exclusive (multi-label), so each label is a binary
split of the texts (has it / has not); the unlabeled share is one more such split. The
top-confidence histogram (the same buckets on both sides) gets PSI plus a chi-square test of
homogeneity; the overall label-mix PSI is reported for dashboards, not decided on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from seqcls.contract import shipped
from seqcls.errors import InputError
from seqcls.monitoring.reference import Reference

#: Shares are clipped to [EPSILON, 1 - EPSILON] before a logarithm: a label absent on one side must
#: give a large, finite PSI.
EPSILON = 1e-4
UNLABELED = "(no label)"
DRIFT, NO_DRIFT, NOT_ENOUGH = "drift", "no_drift", "not_enough_traffic"
DRIFTED, STEADY, TOO_RARE = "drifted", "steady", "too_rare"


@dataclass(frozen=True)
class Thresholds:
    """When a shift counts as drift (the defaults are the usual PSI / significance conventions)."""

    psi: float = 0.1  # < 0.1 is commonly read as "no significant change"
    alpha: float = 0.001  # strict: a monitor runs often, and every label is a test
    min_texts: int = 200  # live texts before anything is judged
    min_count: int = 5  # expected or observed texts of a label before it is judged (the z-test's rule of thumb)

    def __post_init__(self) -> None:
        if not (self.psi > 0 and math.isfinite(self.psi)):
            raise InputError(f"PSI threshold {self.psi!r} must be a positive number (0.1 is usual; 0.25 = major shift)")
        if not 0 < self.alpha < 1:
            raise InputError(f"alpha {self.alpha!r} must be between 0 and 1 (e.g. 0.001)")
        if self.min_texts < 1 or self.min_count < 1:
            raise InputError(f"minimum counts must be ≥ 1 (min_texts={self.min_texts}, min_count={self.min_count})")


@dataclass(frozen=True)
class Counts:
    """What one version decided over some window, as the serving models count it (see ``seqcls_contract``)."""

    texts: int = 0
    labels: dict[str, int] = field(default_factory=dict)  # per metric series (OTHER_LABEL sums the rest)
    unlabeled: int = 0
    confidence: dict[float, int] = field(default_factory=dict)  # cumulative count per bucket bound (inf included)

    def plus(self, other: Counts) -> Counts:
        return Counts(
            self.texts + other.texts,
            _merge(self.labels, other.labels, 1),
            self.unlabeled + other.unlabeled,
            _merge(self.confidence, other.confidence, 1),
        )

    def minus(self, earlier: Counts) -> Counts:
        """What happened since ``earlier`` (a reading of the same counters)."""
        return Counts(
            self.texts - earlier.texts,
            _merge(self.labels, earlier.labels, -1),
            self.unlabeled - earlier.unlabeled,
            _merge(self.confidence, earlier.confidence, -1),
        )

    def reset_since(self, earlier: Counts) -> bool:
        """Did the counters restart after ``earlier`` (a counter only grows until its version is reloaded)?"""
        diff = self.minus(earlier)
        values = [diff.texts, diff.unlabeled, *diff.labels.values(), *diff.confidence.values()]
        return any(v < 0 for v in values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "texts": self.texts,
            "labels": dict(self.labels),
            "unlabeled": self.unlabeled,
            "confidence": {repr(le): n for le, n in sorted(self.confidence.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Counts:
        return cls(
            int(data.get("texts", 0)),
            {str(k): int(v) for k, v in (data.get("labels") or {}).items()},
            int(data.get("unlabeled", 0)),
            {float(k): int(v) for k, v in (data.get("confidence") or {}).items()},
        )


def _merge(a: Mapping[Any, int], b: Mapping[Any, int], sign: int) -> dict[Any, int]:
    return {k: a.get(k, 0) + sign * b.get(k, 0) for k in {**a, **b}}


@dataclass(frozen=True)
class LabelDrift:
    """One label (or the unlabeled share) as a has/has-not split of the texts, reference vs live."""

    label: str
    reference_count: int
    reference_share: float
    live_count: int
    live_share: float
    psi: float
    p_value: float
    status: str  # DRIFTED | STEADY | TOO_RARE

    @property
    def drifted(self) -> bool:
        return self.status == DRIFTED


@dataclass(frozen=True)
class HistogramDrift:
    """The top-confidence histogram, reference vs live (adjacent sparse buckets merged for the test)."""

    psi: float
    p_value: float
    bins: int
    status: str  # DRIFTED | STEADY | TOO_RARE
    reference_shares: list[float] = field(default_factory=list)
    live_shares: list[float] = field(default_factory=list)
    bounds: list[float] = field(default_factory=list)  # upper bound of each share's bucket (inf last)

    @property
    def drifted(self) -> bool:
        return self.status == DRIFTED


@dataclass
class DriftReport:
    """Live traffic of one served version against its reference; the context is filled by :mod:`.live`."""

    state: str  # DRIFT | NO_DRIFT | NOT_ENOUGH
    texts: int
    reference_texts: int
    reference_source: str
    labels: list[LabelDrift]
    unlabeled: LabelDrift
    label_mix_psi: float
    confidence: HistogramDrift | None
    thresholds: Thresholds
    model_name: str = ""
    version: int | None = None
    window: dict[str, Any] = field(default_factory=dict)  # text, since, start, end, basis
    notes: list[str] = field(default_factory=list)
    replicas: dict[str, str] = field(default_factory=dict)  # endpoint → "ok" or why it was not read
    other_versions: dict[int, int] = field(default_factory=dict)  # other loaded versions → their texts

    @property
    def drifted(self) -> list[LabelDrift]:
        return [d for d in self.labels if d.drifted]

    @property
    def drift_found(self) -> bool:
        return self.state == DRIFT

    def summary(self) -> str:
        if self.state == NOT_ENOUGH:
            return f"not enough traffic: {self.texts:,} texts, need {self.thresholds.min_texts:,}"
        parts = [f"{len(self.drifted)} label{'s' if len(self.drifted) != 1 else ''} drifted"] if self.drifted else []
        if self.unlabeled.drifted:
            parts.append("the unlabeled share drifted")
        if self.confidence is not None and self.confidence.drifted:
            parts.append("top confidence drifted")
        return ", ".join(parts) or "no drift"

    def headline(self) -> str:
        who = f"{self.model_name} Triton v{self.version}" if self.version is not None else self.model_name or "live"
        return f"{who}: {self.texts:,} texts {self.window.get('text', '')}".rstrip() + f"; {self.summary()}"

    def lines(self) -> list[str]:
        """The headline, a table of what drifted, then the notes (resets, short windows, unread replicas)."""
        out = [self.headline()]
        rows = self.drifted + ([self.unlabeled] if self.unlabeled.drifted else [])
        if rows:
            width = max(len("label"), *(len(d.label) for d in rows))
            out.append(f"  {'label':<{width}}  {'reference':>9}  {'live':>6}  {'PSI':>7}  {'p':>7}")
            for d in rows:
                shares = f"{d.reference_share:>9.1%}  {d.live_share:>6.1%}"
                out.append(f"  {d.label:<{width}}  {shares}  {d.psi:>7.3f}  {d.p_value:>7.1e}")
        conf = self.confidence
        if conf is not None and conf.drifted:
            out.append(f"  top confidence: PSI {conf.psi:.3f}, p {conf.p_value:.1e} over {conf.bins} buckets")
        if self.other_versions:
            others = ", ".join(f"v{v} {n:,} texts" for v, n in self.other_versions.items())
            out.append(f"  other loaded versions (not compared): {others}")
        out += [f"  note: {note}" for note in self.notes]
        return out

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["other_versions"] = {str(v): n for v, n in self.other_versions.items()}
        if data["confidence"]:  # strict JSON has no Infinity: the last bucket is Prometheus' "+Inf"
            data["confidence"]["bounds"] = [b if math.isfinite(b) else "+Inf" for b in data["confidence"]["bounds"]]
        data["summary"] = self.summary()
        data["headline"] = self.headline()
        data["drifted"] = [d.label for d in self.drifted] + [UNLABELED] * self.unlabeled.drifted
        return data


# ----------------------------------------------------------------------------- statistics


def _clip(share: float) -> float:
    return min(max(share, EPSILON), 1.0 - EPSILON)


def psi(live: Sequence[float], reference: Sequence[float]) -> float:
    """Population-stability index of two distributions over the same bins (shares, each summing to 1)."""
    pairs = [(_clip(p), _clip(q)) for p, q in zip(live, reference, strict=True)]
    return float(sum((p - q) * math.log(p / q) for p, q in pairs))


def binary_psi(live_share: float, reference_share: float) -> float:
    """PSI of the has-label / has-not split."""
    return psi([live_share, 1.0 - live_share], [reference_share, 1.0 - reference_share])


def two_proportion_p(x1: int, n1: int, x2: int, n2: int) -> float:
    """Two-sided p-value of "x1/n1 and x2/n2 are the same proportion" (pooled z-test; 1.0 without variance)."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2))
    if se == 0.0:
        return 1.0
    z = (x1 / n1 - x2 / n2) / se
    return math.erfc(abs(z) / math.sqrt(2.0))


def chi2_sf(x: float, df: int) -> float:
    """P(χ²_df ≥ x): exact for 1 and 2 degrees of freedom, Wilson-Hilferty's normal approximation above."""
    if df <= 0 or x <= 0:
        return 1.0
    if df == 1:
        return math.erfc(math.sqrt(x / 2.0))
    if df == 2:
        return math.exp(-x / 2.0)
    h = 2.0 / (9.0 * df)
    z = ((x / df) ** (1.0 / 3.0) - (1.0 - h)) / math.sqrt(h)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def chi2_homogeneity(a: Sequence[int], b: Sequence[int]) -> tuple[float, int]:
    """χ² statistic and degrees of freedom of "samples ``a`` and ``b`` share one distribution over these bins"."""
    n1, n2 = sum(a), sum(b)
    total = n1 + n2
    stat, used = 0.0, 0
    for x, y in zip(a, b, strict=True):
        col = x + y
        if col == 0:
            continue
        used += 1
        for observed, n in ((x, n1), (y, n2)):
            expected = n * col / total
            stat += (observed - expected) ** 2 / expected
    return stat, max(used - 1, 0)


# ----------------------------------------------------------------------------- comparisons


def label_drift(label: str, live: int, texts: int, ref: int, ref_texts: int, t: Thresholds) -> LabelDrift:
    """Compare one has/has-not split (counts above ``texts`` are capped: ``__other__`` may count a text twice)."""
    live, ref = min(live, texts), min(ref, ref_texts)
    p, q = (live / texts if texts else 0.0), (ref / ref_texts if ref_texts else 0.0)
    value, p_value = binary_psi(p, q), two_proportion_p(live, texts, ref, ref_texts)
    status = _verdict(texts, value, p_value, t, enough=ref_texts > 0 and max(q * texts, live) >= t.min_count)
    return LabelDrift(label, ref, q, live, p, value, p_value, status)


def reference_series(reference: Reference, metric_labels: Sequence[str] | None) -> dict[str, int]:
    """The reference counted as the serving models count it: labels without their own series summed
    under ``OTHER_LABEL`` (every label has one when ``metric_labels`` is None, as in the models)."""
    if metric_labels is None:
        return dict(reference.labels)
    other = shipped.contract().OTHER_LABEL
    keep = set(metric_labels)
    out: dict[str, int] = {}
    for label, n in reference.labels.items():
        series = label if label in keep else other
        out[series] = out.get(series, 0) + int(n)
    return out


def _cells(cumulative: Mapping[float, int], bounds: Sequence[float]) -> list[int]:
    counts = [int(cumulative[b]) for b in bounds]
    return [c - (counts[i - 1] if i else 0) for i, c in enumerate(counts)]


def _merge_sparse(a: list[int], b: list[int], min_count: int) -> tuple[list[int], list[int]]:
    """Merge adjacent buckets until each holds at least ``min_count`` expected texts of the smaller
    sample (the χ² approximation needs that; the buckets are ordered, so neighbours merge)."""
    n1, n2 = sum(a), sum(b)
    smaller, total = min(n1, n2), n1 + n2
    out_a: list[int] = []
    out_b: list[int] = []
    acc_a = acc_b = 0
    for x, y in zip(a, b, strict=True):
        acc_a, acc_b = acc_a + x, acc_b + y
        if total and smaller * (acc_a + acc_b) / total >= min_count:
            out_a.append(acc_a)
            out_b.append(acc_b)
            acc_a = acc_b = 0
    if not out_a:
        return [acc_a], [acc_b]
    out_a[-1] += acc_a  # a sparse tail joins the last full bucket
    out_b[-1] += acc_b
    return out_a, out_b


def _verdict(texts: int, value: float, p_value: float, t: Thresholds, enough: bool = True) -> str:
    if texts < t.min_texts or not enough:
        return TOO_RARE
    return DRIFTED if value >= t.psi and p_value < t.alpha else STEADY


def confidence_drift(reference: Reference, live: Counts, t: Thresholds) -> HistogramDrift | None:
    """The top-confidence histograms over the bucket bounds both sides have (None: nothing in common)."""
    pairs = zip(reference.confidence_buckets, reference.confidence_counts, strict=False)
    ref_cum = {float(b): int(n) for b, n in pairs}
    if reference.confidence_counts:
        ref_cum[math.inf] = int(reference.confidence_counts[-1])
    bounds = sorted(set(ref_cum) & set(live.confidence))
    if not bounds or bounds[-1] != math.inf or not reference.texts:
        return None
    a, b = _cells(live.confidence, bounds), _cells(ref_cum, bounds)
    n1, n2 = sum(a), sum(b)
    if n1 <= 0:
        return HistogramDrift(0.0, 1.0, len(bounds), TOO_RARE, bounds=bounds)
    value = psi([x / n1 for x in a], [y / n2 for y in b])
    ma, mb = _merge_sparse(a, b, t.min_count)
    stat, df = chi2_homogeneity(ma, mb)
    p_value = chi2_sf(stat, df)
    status = _verdict(n1, value, p_value, t)
    ref_shares, live_shares = [y / n2 for y in b], [x / n1 for x in a]
    return HistogramDrift(value, p_value, len(ma), status, ref_shares, live_shares, bounds)


def label_mix_psi(reference: Mapping[str, int], ref_unlabeled: int, live: Counts) -> float:
    """PSI of the share of all decisions each label (and "no label") takes: one number for a dashboard."""
    keys = sorted(set(reference) | set(live.labels))
    ref = [*(reference.get(k, 0) for k in keys), ref_unlabeled]
    cur = [*(live.labels.get(k, 0) for k in keys), live.unlabeled]
    if not sum(ref) or not sum(cur):
        return 0.0
    return psi([x / sum(cur) for x in cur], [y / sum(ref) for y in ref])


def compare(
    reference: Reference,
    live: Counts,
    thresholds: Thresholds | None = None,
    metric_labels: Sequence[str] | None = None,
) -> DriftReport:
    """Judge ``live`` (one version's counts over a window) against the ``reference`` it was released with."""
    t = thresholds or Thresholds()
    ref = reference_series(reference, metric_labels)
    n, m = live.texts, reference.texts
    keys = sorted(set(ref) | set(live.labels))
    labels = [label_drift(k, live.labels.get(k, 0), n, ref.get(k, 0), m, t) for k in keys]
    unlabeled = label_drift(UNLABELED, live.unlabeled, n, reference.unlabeled, m, t)
    confidence = confidence_drift(reference, live, t)
    if n < t.min_texts:
        state = NOT_ENOUGH
    elif any(d.drifted for d in labels) or unlabeled.drifted or (confidence is not None and confidence.drifted):
        state = DRIFT
    else:
        state = NO_DRIFT
    labels.sort(key=lambda d: (not d.drifted, -d.psi, d.label))
    notes = []
    if m < t.min_texts:
        notes.append(
            f"the reference ({reference.source}) has only {m} texts: only large shifts can be told from noise; "
            "release with an eval set for a firmer baseline"
        )
    mix = label_mix_psi(ref, reference.unlabeled, live)
    return DriftReport(state, n, m, reference.source, labels, unlabeled, mix, confidence, t, notes=notes)
