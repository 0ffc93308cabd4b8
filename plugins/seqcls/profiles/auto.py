"""``profile: auto`` — measure each serving profile on this host, check it against fp32, serve the fastest that passes.

Which profile is fastest depends on the CPU (AVX512-VNNI / AMX make int8 pay, an old CPU may not), and
whether a faster one is good enough depends on the model: so the choice is measured, at convert, not
guessed. Each candidate (:data:`CANDIDATES`) is built from the converted ``model.onnx`` (convert's
job), then timed here in process under ONNX Runtime with the parity gate's session settings (provider,
threads) over the golden texts and, when the release has a labeled eval set, texts spread over it (at most
:data:`MAX_TEXTS`), as :mod:`seqcls.profiles.timing` times what will be served: every length warmed first,
single-text passes until the rate is steady, then at the concurrency the model expects (``expected_clients``,
default 8). The rate at that concurrency decides; the single-text rate and every pass's rate are evidence.

A non-fp32 candidate passes when, on those texts, its label decisions agree with fp32's at least
``min_decision_agreement`` (the parity gate's rule for a non-exact profile), and — with an eval set — its
micro- and macro-F1 on the *whole* set drop at most ``max_profile_f1_drop`` below fp32's, scored by the
quality gate's own code (:mod:`seqcls.gates.scoring`, :mod:`seqcls.gates.rules`), so a profile chosen
here is not refused later by the quality gate's profile rule. fp32 always passes (it is exact). The
fastest passing candidate (sentences/s) is served. The parity and quality gates then judge it as
they judge a profile configured by hand.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.contract import runtime, shipped
from seqcls.gates import parity
from seqcls.gates.evalset import EvalSet
from seqcls.gates.metrics import Scores, score
from seqcls.gates.rules import QualityRules, judge
from seqcls.gates.scoring import Graph, predict
from seqcls.profiles import timing
from seqcls.spec import AUTO_PROFILE, SERVED_PROFILES

log = logging.getLogger(__name__)

AUTO = AUTO_PROFILE
#: The profiles ``auto`` chooses from, fp32 first (the reference every other is checked against).
CANDIDATES = SERVED_PROFILES
#: Texts timed per candidate (golden first, then eval texts spread over the set).
MAX_TEXTS = 200
#: The evidence file convert writes beside the graphs.
CHOICE_FILE = "profile_choice.json"


@dataclass(frozen=True)
class Rules:
    """What a candidate must keep against fp32 (the release's own gate parameters)."""

    min_decision_agreement: float
    max_profile_f1_drop: float | None
    near_margin: float = 1e-3
    hierarchy: bool = True


@dataclass
class Trial:
    """One candidate as built and measured: its graph (None: the build failed, ``error`` says why), the
    latency of each single-text request (seconds) in the recorded pass, its probabilities on the timed texts
    (each text alone), its scores on the eval set (None without one), and how it was timed (``timed``:
    the passes' curve and the rate at the expected concurrency; None when a test gives latencies only)."""

    profile: str
    onnx: Path | None
    latencies: list[float] = field(default_factory=list)
    timed: timing.Timing | None = None
    probabilities: np.ndarray | None = None
    scores: Scores | None = None
    build_seconds: float = 0.0
    error: str | None = None


@dataclass
class Candidate:
    """One candidate in the evidence: its timings, its checks against fp32, and the verdict."""

    profile: str
    texts: int = 0
    sentences_per_s: float | None = None  # what decides: at the expected concurrency, else single texts
    single_sentences_per_s: float | None = None  # one text at a time, the recorded (steady) pass
    clients: int = 1  # the concurrency sentences_per_s was measured at
    passes_sentences_per_s: list[float] = field(default_factory=list)  # every single-text pass: the curve
    concurrent_passes_sentences_per_s: list[float] = field(default_factory=list)  # at ``clients``: its curve
    steady: bool | None = None  # the last two passes within timing.STEADY, both curves (False: MAX_PASSES ran out)
    warm_lengths: int = 0  # distinct lengths run untimed before the passes
    p50_ms: float | None = None
    p95_ms: float | None = None
    build_seconds: float = 0.0
    agreement: float | None = None
    micro_f1: float | None = None
    macro_f1: float | None = None
    micro_f1_drop: float | None = None
    macro_f1_drop: float | None = None
    passed: bool = False
    reason: str | None = None  # why it was rejected (None: it passed)
    error: str | None = None  # the build failed


@dataclass
class ProfileChoice:
    """What ``auto`` chose, every candidate's figures, and the conditions they were measured under."""

    chosen: str
    candidates: list[Candidate]
    texts: int
    golden_texts: int
    eval_texts: int
    eval_scored: int | None
    provider: str = "CPUExecutionProvider"
    threads: int | None = None
    clients: int = 1  # the expected concurrency the deciding rate was measured at
    rules: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rejected(self) -> list[Candidate]:
        return [c for c in self.candidates if not c.passed]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rejected": {c.profile: c.reason for c in self.rejected}}

    def summary(self) -> dict[str, Any]:
        """The short form for the convert record (the full one is :data:`CHOICE_FILE`)."""
        return {
            "chosen": self.chosen,
            "sentences_per_s": {c.profile: c.sentences_per_s for c in self.candidates},
            "p50_ms": {c.profile: c.p50_ms for c in self.candidates},
            "rejected": {c.profile: c.reason for c in self.rejected},
            "texts": self.texts,
        }

    def line(self) -> str:
        """``auto chose int8: fastest that passes, 131 sentences/s vs fp32 41 at 8 clients (…); rejected: …``."""
        by = {c.profile: c for c in self.candidates}
        won, ref = by[self.chosen], by.get("fp32")
        speed = f"{won.sentences_per_s:.0f} sentences/s" if won.sentences_per_s else "unmeasured"
        versus = (
            f" vs fp32 {ref.sentences_per_s:.0f}" if ref and ref.profile != won.profile and ref.sentences_per_s else ""
        )
        faster = any(c.passed and (c.sentences_per_s or 0.0) > (won.sentences_per_s or 0.0) for c in self.candidates)
        why = f"no faster graph leads by ≥{MIN_SPEEDUP - 1:.0%}" if faster else "fastest that passes"
        how = f"at {won.clients} clients" if won.clients > 1 else "one text at a time"
        single = (
            f", {won.single_sentences_per_s:.0f} one at a time"
            if won.clients > 1 and won.single_sentences_per_s
            else ""
        )
        out = f"auto chose {self.chosen}: {why}, {speed}{versus} {how} on {self.texts} texts{single}"
        if self.rejected:
            out += "; rejected: " + "; ".join(f"{c.profile} ({c.reason})" for c in self.rejected)
        return out

    def table(self) -> list[str]:
        """The candidates as a small text table (the task log's story): the deciding rate (at the expected
        concurrency), one text at a time, its latencies, checks, and the single-text passes' curve."""
        top = max((c.clients for c in self.candidates), default=1)
        cols = (f"{top} cl/s", "1 text/s", "p50 ms", "p95 ms", "agree", "Δ micro", "Δ macro")
        head = f"{'profile':<11} " + " ".join(f"{c:>8}" for c in cols) + "  verdict  (passes, sentences/s)"
        rows = [head, "-" * len(head)]
        for c in self.candidates:
            verdict = ("CHOSEN" if c.profile == self.chosen else "passed") if c.passed else f"rejected: {c.reason}"
            curve = " → ".join(f"{r:.1f}" for r in c.passes_sentences_per_s)
            rows.append(
                f"{c.profile:<11} {_num(c.sentences_per_s, '.1f'):>8} {_num(c.single_sentences_per_s, '.1f'):>8} "
                f"{_num(c.p50_ms, '.2f'):>8} {_num(c.p95_ms, '.2f'):>8} {_num(c.agreement, '.4f'):>8} "
                f"{_num(c.micro_f1_drop, '.4f'):>8} {_num(c.macro_f1_drop, '.4f'):>8}  {verdict}"
                + (f"  ({curve}{'' if c.steady else ', not steady'})" if curve else "")
            )
        return rows


def _num(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


# ----------------------------------------------------------------------------- choosing (pure)


#: How much faster than fp32 a non-exact graph must be to be served instead: timings on a shared host
#: wander by a few percent, and a lead inside that is not worth giving up exactness for.
MIN_SPEEDUP = 1.05


def choose(
    trials: Sequence[Trial], texts: Sequence[str], labels: Sequence[str], thresholds: np.ndarray, rules: Rules
) -> ProfileChoice:
    """Judge every trial against the fp32 one and pick the fastest that passes (fp32 when none does)."""
    by = {t.profile: t for t in trials}
    if "fp32" not in by or by["fp32"].error is not None:
        raise ValueError("profile auto needs the fp32 graph measured: it is the reference and the fallback")
    ref = by["fp32"]
    notes = []
    if ref.scores is None:
        notes.append("no eval set: candidates checked on decision agreement only (no labeled Δ F1)")
    elif rules.max_profile_f1_drop is None:
        notes.append("max_profile_f1_drop is off: labeled Δ F1 reported, not checked")
    candidates = [_judged(t, ref, texts, labels, thresholds, rules) for t in trials]
    passing = [c for c in candidates if c.passed]
    fastest = max(passing, key=lambda c: c.sentences_per_s or 0.0)
    chosen = fastest.profile
    exact = next(c for c in candidates if c.profile == "fp32")
    lead = (fastest.sentences_per_s or 0.0) / max(exact.sentences_per_s or 0.0, 1e-12)
    if chosen != "fp32" and lead < MIN_SPEEDUP:
        notes.append(
            f"{chosen} only {lead - 1:.0%} faster than fp32, within the noise of a shared host "
            f"(a non-exact graph needs ≥{MIN_SPEEDUP - 1:.0%}): fp32 served"
        )
        chosen = "fp32"
    return ProfileChoice(
        chosen,
        candidates,
        texts=len(texts),
        golden_texts=len(texts),
        eval_texts=0,
        eval_scored=ref.scores.texts if ref.scores is not None else None,
        rules=asdict(rules),
        notes=notes,
    )


def _judged(
    trial: Trial, ref: Trial, texts: Sequence[str], labels: Sequence[str], thresholds: np.ndarray, rules: Rules
) -> Candidate:
    c = Candidate(trial.profile, build_seconds=round(trial.build_seconds, 2), error=trial.error)
    if trial.error is not None:
        c.reason = f"build failed: {trial.error}"
        return c
    ms = np.asarray(trial.latencies, dtype=np.float64) * 1000.0
    c.texts = len(ms)
    c.single_sentences_per_s = c.sentences_per_s = round(len(ms) / max(float(ms.sum()) / 1000.0, 1e-12), 2)
    c.p50_ms, c.p95_ms = round(float(np.percentile(ms, 50)), 3), round(float(np.percentile(ms, 95)), 3)
    if trial.timed is not None:
        t = trial.timed
        c.passes_sentences_per_s = [round(r, 2) for r in t.passes]
        c.steady, c.warm_lengths = t.steady, t.warm_lengths
        if t.concurrent is not None:  # what will be served decides: the rate at the expected concurrency
            c.sentences_per_s, c.clients = round(t.concurrent, 2), t.clients
            c.concurrent_passes_sentences_per_s = [round(r, 2) for r in t.concurrent_passes]
            c.steady = t.steady and bool(t.concurrent_steady)
    if trial.scores is not None:
        c.micro_f1, c.macro_f1 = round(trial.scores.micro_f1, 6), round(trial.scores.macro_f1, 6)
    if trial is ref:
        c.passed, c.agreement = True, 1.0
        if trial.scores is not None:
            c.micro_f1_drop = c.macro_f1_drop = 0.0
        return c
    reasons = []
    dc = parity.decision_report(
        texts,
        ref.probabilities,
        trial.probabilities,
        thresholds,
        list(labels),
        rules.near_margin,
        rules.hierarchy,
        shipped.decide(),
    )
    c.agreement = round(float(dc["agreement"]), 6)
    if dc["agreement"] < rules.min_decision_agreement:
        reasons.append(
            f"decision agreement {dc['agreement']:.4f} < min_decision_agreement {rules.min_decision_agreement:g} "
            f"({dc['changed']} of {dc['texts']} label sets changed vs fp32)"
        )
    if trial.scores is not None and ref.scores is not None:
        c.micro_f1_drop = round(ref.scores.micro_f1 - trial.scores.micro_f1, 6)
        c.macro_f1_drop = round(ref.scores.macro_f1 - trial.scores.macro_f1, 6)
        if rules.max_profile_f1_drop is not None:
            verdict = judge(trial.scores, None, _profile_rule(rules.max_profile_f1_drop), fp32=ref.scores)
            reasons += [f.describe() for f in verdict.failures]
    c.passed, c.reason = not reasons, "; ".join(reasons) or None
    return c


def _profile_rule(max_drop: float) -> QualityRules:
    """The quality gate's rules with only the profile rule on (the champion is not this step's business)."""
    kept = ("min_label_support", "max_profile_f1_drop")  # the one rule, and a setting that is not a rule
    off = {f.name: None for f in fields(QualityRules) if f.name not in kept}
    return QualityRules(**off, max_profile_f1_drop=max_drop)


# ----------------------------------------------------------------------------- measuring (ONNX Runtime)


@dataclass(frozen=True)
class Answering:
    """How a graph is fed and decided, as served: the serving tokenizer, pad id, labels, thresholds."""

    tokenizer: Any
    pad_id: int
    labels: list[str]
    thresholds: np.ndarray
    hierarchy: bool
    providers: list[str]


def pick_texts(golden: Sequence[str], eval_texts: Sequence[str], limit: int = MAX_TEXTS) -> tuple[list[str], int]:
    """The timed texts: the golden ones, then eval texts spread evenly over the set, ``limit`` in all;
    returns them and how many are golden."""
    gold = _spread(list(golden), limit)
    rest = _spread(list(eval_texts), limit - len(gold))
    return gold + rest, len(gold)


def _spread(items: list[str], n: int) -> list[str]:
    if n <= 0:
        return []
    if len(items) <= n:
        return items
    return [items[int(i * len(items) / n)] for i in range(n)]


def time_requests(
    graphs: dict[str, Path], texts: Sequence[str], how: Answering, clients: int = timing.DEFAULT_CLIENTS
) -> tuple[dict[str, timing.Timing], dict[str, np.ndarray], int | None]:
    """Each graph timed as it will be served (:func:`seqcls.profiles.timing.time_graphs`: every length warmed,
    steady single-text passes taking turns by whole passes, then ``clients`` pending requests): the timings,
    the probabilities of the recorded pass (each text alone) and the ONNX Runtime threads."""
    text_mod, decide_mod = shipped.text(), shipped.decide()
    ids = text_mod.encode(how.tokenizer, list(texts))
    sessions = {name: runtime.session(path, how.providers, profile=name) for name, path in graphs.items()}
    feeds = {}
    for name, session in sessions.items():
        names = [i.name for i in session.get_inputs()]
        feeds[name] = [next(runtime.feeds([x], names, how.pad_id)) for x in ids]
    timings = timing.time_graphs(sessions, feeds, shipped.contract().LOGITS_OUTPUT, clients)
    probs = {name: decide_mod.sigmoid(np.concatenate(t.outputs).astype(np.float32)) for name, t in timings.items()}
    options = [s.get_session_options() for s in sessions.values() if hasattr(s, "get_session_options")]
    return timings, probs, options[0].intra_op_num_threads if options else None


def score_eval(graphs: dict[str, Path], es: EvalSet, how: Answering) -> dict[str, Scores]:
    """Each graph on the whole eval set exactly as the quality gate scores a candidate (its own code)."""
    out = {}
    for name, path in graphs.items():
        graph = Graph(name, path, how.tokenizer, how.pad_id, how.labels, how.thresholds, how.hierarchy, name)
        answers = predict(graph, es.texts, how.providers)
        out[name] = score(es.labels, answers.labels, how.labels)
    return out


def measure_and_choose(
    built: Sequence[Trial],
    golden: Sequence[str],
    es: EvalSet | None,
    how: Answering,
    rules: Rules,
    clients: int = timing.DEFAULT_CLIENTS,
) -> ProfileChoice:
    """Time every built candidate (at ``clients`` pending requests and one text at a time), score it on the
    eval set, and choose (:func:`choose`)."""
    t0 = time.perf_counter()
    texts, n_golden = pick_texts(golden, es.texts if es is not None else ())
    graphs = {t.profile: t.onnx for t in built if t.error is None and t.onnx is not None}
    log.info(
        "convert: auto — timing %s on %d texts each (%d golden + %d eval texts): every length warmed, "
        "single-text passes until steady (%d–%d), then %d clients",
        ", ".join(graphs),
        len(texts),
        n_golden,
        len(texts) - n_golden,
        timing.MIN_PASSES,
        timing.MAX_PASSES,
        clients,
    )
    timings, probs, threads = time_requests(graphs, texts, how, clients)
    scores = {}
    if es is not None:
        t1 = time.perf_counter()
        scores = score_eval(graphs, es, how)
        log.info(
            "convert: auto — scored %d graphs on the %d-text eval set in %.1fs",
            len(graphs),
            len(es.texts),
            time.perf_counter() - t1,
        )
    for t in built:
        if t.profile in graphs:
            t.timed, t.probabilities, t.scores = timings[t.profile], probs[t.profile], scores.get(t.profile)
            t.latencies = t.timed.latencies
    choice = choose(list(built), texts, how.labels, how.thresholds, rules)
    choice.golden_texts, choice.eval_texts = n_golden, len(texts) - n_golden
    choice.provider, choice.threads, choice.clients = how.providers[0], threads, clients
    unsteady = [c.profile for c in choice.candidates if c.steady is False]
    if unsteady:  # the host's load moved under the passes: the figures are the last pass's, said so
        choice.notes.append(
            f"not steady after {timing.MAX_PASSES} passes (>{timing.STEADY:.0%} between the last two): "
            + ", ".join(unsteady)
        )
    choice.seconds = round(time.perf_counter() - t0, 2)
    for row in choice.table():
        log.info("convert: auto   %s", row)
    log.info("convert: %s", choice.line())
    return choice


__all__ = [
    "AUTO",
    "CANDIDATES",
    "CHOICE_FILE",
    "MAX_TEXTS",
    "Answering",
    "Candidate",
    "ProfileChoice",
    "Rules",
    "Trial",
    "choose",
    "measure_and_choose",
    "pick_texts",
    "score_eval",
    "time_requests",
    "timing",
]
