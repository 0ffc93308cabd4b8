"""Calibrate the quality gate's paired test on the demo model's seed-to-seed spread.

The gate must pass a retrain that is merely another training seed (equally good) and refuse the quick
retrain (4 epochs, no dropout: held-out micro-F1 about 0.93 against 0.99), on a small eval set (100
texts) as on a large one (2,000). This trains the demo model (``seqcls_tools.demo.train``, full mode,
epoch-bound) at several seeds — seed 0 is the champion, the others equally good retrains — and the
quick retrain, generates labeled eval sets from another dataset seed with every text of the demo's
training, dev and test splits removed (so no model saw them), answers them with each checkpoint (the
demo's own scoring: PaddleNLP's model and tokenizer from the checkpoint, sigmoid, threshold 0.5) and
judges each retrain against the champion with the gate's default rules and its paired test
(:func:`seqcls.gates.rules.paired_test`), and with the thresholds alone for comparison. It prints the
false-refusal rate of the equal retrains (every ordered pair of seeds as well), whether the quick retrain
is refused at each size, and the drops' intervals; then the cost of the bootstrap at 200,000 texts
(time, and peak memory by ``tracemalloc``), on the CPU it names. ::

    .venv/bin/python -m seqcls_tools.bench.paired_calibration [--work DIR] [--seeds 0 1 2 3 4] [--json OUT]

Checkpoints already in ``--work`` (``full<seed>``, ``quick0``, each with ``SEQCLS_DONE.json``) are reused.
Training takes about 2–3 min per full seed on two idle cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("seqcls_tools.bench.paired_calibration")

SEEDS = (0, 1, 2, 3, 4)
SIZES = (100, 2000)
#: The dataset seed of the eval sets: not the demo's (20240607), so its texts are new draws.
EVAL_SEED = 777
COST_TEXTS = 200_000
#: Epoch-bound training: a busy machine must not cut a "full" model short by the time budget.
MAX_SECONDS = 900.0
QUICK_MAX_SECONDS = 600.0
#: The metrics whose intervals the report prints.
SHOWN = ("micro_f1", "macro_f1", "sample_accuracy")
#: The large set is also cut into disjoint sets of these sizes: many draws, not one.
SLICES = (100, 200, 500)


@dataclass
class Judged:
    """One retrain against the champion on one eval set."""

    candidate: str
    champion: str
    texts: int
    passed: bool
    passed_thresholds_alone: bool
    #: the design before calibration: refuse a drop over the threshold whose lower bound is above 0
    passed_lower_above_zero: bool
    failures: list[str]
    too_small: int
    intervals: dict[str, dict[str, float]]
    candidate_micro_f1: float
    champion_micro_f1: float


def train_models(work: Path, seeds: Sequence[int]) -> dict[str, Path]:
    """``full<seed>`` per seed and ``quick0``, trained into ``work`` unless already there."""
    from seqcls_tools.demo.train import train_demo_checkpoint

    out: dict[str, Path] = {}
    plan: list[tuple[str, dict[str, Any]]] = [(f"full{s}", {"seed": s, "max_seconds": MAX_SECONDS}) for s in seeds]
    plan.append(("quick0", {"seed": 0, "quick": True, "max_seconds": QUICK_MAX_SECONDS}))
    for name, kw in plan:
        path = work / name
        if not (path / "SEQCLS_DONE.json").is_file():
            log.info("training %s into %s", name, path)
            train_demo_checkpoint(path, **kw)
        out[name] = path
    return out


def eval_sets(sizes: Sequence[int] = SIZES, seed: int = EVAL_SEED) -> dict[int, list[dict]]:
    """Disjoint labeled sets of each size, from dataset seed ``seed``, without any text of the demo's splits."""
    from seqcls_tools.demo import SPLITS, load_split
    from seqcls_tools.demo.make_dataset import generate

    seen = {row["text"] for split in SPLITS for row in load_split(split)}
    need = sum(sizes)
    pool = [
        r for r in generate(seed=seed, sizes={"train": 0, "dev": 0, "test": 2 * need})["test"] if r["text"] not in seen
    ]
    if len(pool) < need:
        raise RuntimeError(f"only {len(pool)} new texts from dataset seed {seed}, need {need}")
    out, start = {}, 0
    for size in sizes:
        out[size] = pool[start : start + size]
        start += size
    return out


def demo_answers(checkpoint: Path, texts: Sequence[str], threshold: float = 0.5) -> list[list[str]]:
    """Each text's label set from ``checkpoint`` as the demo scores it: PaddleNLP model and tokenizer, sigmoid,
    ``threshold``."""
    from paddlenlp.transformers import ErnieForSequenceClassification, ErnieTokenizer
    from paddlenlp.utils.log import logger as paddlenlp_log

    from seqcls_tools.demo.fit import MAX_LENGTH, predict_logits, set_threads
    from seqcls_tools.demo.scoring import sigmoid

    set_threads(2)
    paddlenlp_log.set_level("WARNING")  # not one "Loading weights file" line per checkpoint and eval set
    labels = (checkpoint / "label.txt").read_text(encoding="utf-8").split()
    tokenizer = ErnieTokenizer.from_pretrained(str(checkpoint))
    model = ErnieForSequenceClassification.from_pretrained(str(checkpoint))
    ids = list(tokenizer(list(texts), max_length=MAX_LENGTH, truncation=True)["input_ids"])
    probs = sigmoid(predict_logits(model, ids, tokenizer.pad_token_id))
    return [[labels[j] for j in range(len(labels)) if row[j] >= threshold] for row in probs]


def judge_pair(
    gold: Sequence[Sequence[str]],
    cand: Sequence[Sequence[str]],
    champ: Sequence[Sequence[str]],
    labels: Sequence[str],
    names: tuple[str, str],
    resamples: int,
    confidence: float | None = None,
) -> Judged:
    """``cand`` against ``champ`` with the default rules: paired test, and thresholds alone."""
    from seqcls.gates.metrics import score
    from seqcls.gates.rules import QualityRules, judge, judged_labels, paired_test

    rules = QualityRules()
    c, h = score(gold, cand, labels), score(gold, champ, labels)
    conf = {"confidence": confidence} if confidence is not None else {}
    judged = judged_labels(c, h, rules.min_label_support)
    test = paired_test(gold, cand, champ, labels, judged, resamples=resamples, **conf)
    verdict = judge(c, h, rules, paired=test)
    alone = judge(c, h, rules)
    intervals = {}
    for check in verdict.checks:
        if check.rule == "max_f1_drop" and check.metric in SHOWN:
            intervals[check.metric] = {
                "drop": round(float(check.drop or 0), 4),
                "lower": round(float(check.lower or 0), 4),
                "upper": round(float(check.upper or 0), 4),
            }
    above_zero = not any(
        c.paired and c.lower is not None and c.drop is not None and c.drop > c.threshold + 1e-12 and c.lower > 0
        for c in verdict.checks
    )
    return Judged(
        names[0],
        names[1],
        len(gold),
        verdict.passed,
        alone.passed,
        above_zero and all(c.passed for c in verdict.checks if not c.paired),
        [f.describe() for f in verdict.failures],
        len(verdict.too_small),
        intervals,
        round(c.micro_f1, 4),
        round(h.micro_f1, 4),
    )


def bootstrap_cost(gold: Sequence[Sequence[str]], cand, champ, labels, texts: int, resamples: int) -> dict[str, Any]:
    """Time and peak traced memory of the paired test at ``texts`` texts (the answers given, repeated)."""
    import numpy as np

    from seqcls.gates.paired import bootstrap, paired_counts

    reps = -(-texts // len(gold))
    g, c, h = ((list(x) * reps)[:texts] for x in (gold, cand, champ))
    tracemalloc.start()
    t0 = time.perf_counter()
    counts = paired_counts(g, c, h, labels)
    t1 = time.perf_counter()
    test = bootstrap(counts, judged=labels, resamples=resamples)
    t2 = time.perf_counter()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # the worst case for merging: every text its own pattern (random answers over the label space)
    rng = np.random.default_rng(0)
    noisy = [[labels[j] for j in np.flatnonzero(rng.random(len(labels)) < 0.2)] for _ in range(texts)]
    tracemalloc.start()
    t3 = time.perf_counter()
    worst = bootstrap(paired_counts(g, noisy, h, labels), judged=labels, resamples=resamples)
    t4 = time.perf_counter()
    _, worst_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "texts": texts,
        "labels": len(labels),
        "resamples": resamples,
        "patterns": test.patterns,
        "counts_seconds": round(t1 - t0, 2),
        "bootstrap_seconds": round(t2 - t1, 2),
        "peak_mb": round(peak / 2**20, 1),
        "worst_case_patterns": worst.patterns,
        "worst_case_seconds": round(t4 - t3, 2),
        "worst_case_peak_mb": round(worst_peak / 2**20, 1),
    }


def calibrate(work: Path, seeds: Sequence[int], sizes: Sequence[int], resamples: int, cost_texts: int) -> dict:
    from seqcls_tools.bench.machine import isa_text, loadavg, machine_facts
    from seqcls_tools.demo import LABELS

    facts = machine_facts()
    started = time.perf_counter()
    models = train_models(work, seeds)
    trained = {name: json.loads((path / "metrics.json").read_text(encoding="utf-8")) for name, path in models.items()}
    sets = eval_sets(sizes)
    answers = {
        size: {name: demo_answers(path, [r["text"] for r in rows]) for name, path in models.items()}
        for size, rows in sets.items()
    }
    champion = f"full{seeds[0]}"
    pairs: list[Judged] = []
    for size, rows in sets.items():
        gold = [r["labels"] for r in rows]
        a = answers[size]
        for champ in (f"full{s}" for s in seeds):
            for cand in [*(f"full{s}" for s in seeds), "quick0"]:
                if cand != champ and (champ == champion or cand != "quick0"):
                    pairs.append(judge_pair(gold, a[cand], a[champ], LABELS, (cand, champ), resamples))
    equal = [p for p in pairs if p.candidate != "quick0"]
    vs_champion = [p for p in equal if p.champion == champion]
    big = max(sizes)
    fulls = [f"full{s}" for s in seeds]
    slices = [_slices(sets[big], answers[big], n, fulls, champion, resamples) for n in SLICES if n < big]
    cost = bootstrap_cost(
        [r["labels"] for r in sets[big]], answers[big][f"full{seeds[1]}"], answers[big][champion], LABELS,
        cost_texts, resamples,
    )  # fmt: skip
    return {
        "cpu": f"{facts['cpu_model']}, {facts['cpus_usable']} CPUs usable ({isa_text(facts['isa'])})",
        "loadavg": loadavg(),
        "seconds": round(time.perf_counter() - started, 1),
        "resamples": resamples,
        "models": {
            n: {k: m.get(k) for k in ("micro_f1", "macro_f1", "epochs", "seconds", "seed", "quick")}
            for n, m in trained.items()
        },
        "eval_seed": EVAL_SEED,
        "sizes": list(sizes),
        "false_refusals": {
            "vs_champion": {str(s): _rate([p for p in vs_champion if p.texts == s]) for s in sizes},
            "every_ordered_pair": {str(s): _rate([p for p in equal if p.texts == s]) for s in sizes},
            "thresholds_alone_every_ordered_pair": {
                str(s): _rate([p for p in equal if p.texts == s], alone=True) for s in sizes
            },
        },
        "quick_refused": {str(p.texts): not p.passed for p in pairs if p.candidate == "quick0"},
        "slices": slices,
        "pairs": [asdict(p) for p in pairs],
        "cost": cost,
    }


def _slices(
    rows: list[dict], answers: dict[str, list[list[str]]], size: int, fulls: list[str], champion: str, resamples: int
) -> dict[str, Any]:
    """The large set cut into disjoint sets of ``size`` texts: one 100-text draw says little, twenty say more.
    Every ordered pair of equal seeds and the quick retrain against the champion, judged on each slice."""
    from seqcls_tools.demo import LABELS

    equal: list[Judged] = []
    quick: list[Judged] = []
    for start in range(0, len(rows) - size + 1, size):
        part = slice(start, start + size)
        gold = [r["labels"] for r in rows[part]]
        for champ in fulls:
            for cand in fulls:
                if cand != champ:
                    equal.append(
                        judge_pair(gold, answers[cand][part], answers[champ][part], LABELS, (cand, champ), resamples)
                    )
        quick.append(
            judge_pair(gold, answers["quick0"][part], answers[champion][part], LABELS, ("quick0", champion), resamples)
        )
    return {
        "size": size,
        "slices": len(quick),
        "equal_refused": _rate(equal),
        "equal_refused_thresholds_alone": _rate(equal, alone=True),
        "equal_refused_lower_above_zero": _rate(equal, zero=True),
        "quick_refused_lower_above_zero": _rate(quick, zero=True),
        "equal_too_small": sum(p.too_small > 0 for p in equal),
        "quick_refused": f"{sum(not p.passed for p in quick)}/{len(quick)}",
        "quick_micro_f1_drop": sorted(p.intervals["micro_f1"]["drop"] for p in quick),
        "quick_micro_f1_lower": sorted(p.intervals["micro_f1"]["lower"] for p in quick),
        "quick_failures": [p.failures for p in quick if p.passed is False][:1],
        "equal_failures": [p.failures for p in equal if not p.passed],
    }


def _rate(pairs: Sequence[Judged], *, alone: bool = False, zero: bool = False) -> str:
    refused = sum(
        not (p.passed_thresholds_alone if alone else p.passed_lower_above_zero if zero else p.passed) for p in pairs
    )
    return f"{refused}/{len(pairs)}"


def report(result: dict) -> str:
    lines = [
        f"CPU: {result['cpu']}; loadavg {result['loadavg']}; {result['seconds']} s; "
        f"{result['resamples']} resamples, 95% one-sided bounds",
        "models (demo held-out 240 texts): "
        + ", ".join(f"{n} micro-F1 {m['micro_f1']} ({m['epochs']} epochs)" for n, m in result["models"].items()),
    ]
    fr = result["false_refusals"]
    for size in result["sizes"]:
        s = str(size)
        lines.append(
            f"{size} texts: equal retrains refused {fr['vs_champion'][s]} vs the champion, "
            f"{fr['every_ordered_pair'][s]} over every ordered pair (thresholds alone: "
            f"{fr['thresholds_alone_every_ordered_pair'][s]}); quick retrain refused: {result['quick_refused'][s]}"
        )
    for sl in result["slices"]:
        lines.append(
            f"{sl['slices']} disjoint {sl['size']}-text slices of the large set: equal retrains refused "
            f"{sl['equal_refused']} (the design before calibration, over the threshold with lower bound > 0: "
            f"{sl['equal_refused_lower_above_zero']}; thresholds alone: {sl['equal_refused_thresholds_alone']}; "
            f"{sl['equal_too_small']} with a check too small to decide); quick retrain refused {sl['quick_refused']} "
            f"(before calibration: {sl['quick_refused_lower_above_zero']}; micro-F1 drops "
            f"{sl['quick_micro_f1_drop'][0]}–{sl['quick_micro_f1_drop'][-1]}, lower bounds "
            f"{sl['quick_micro_f1_lower'][0]}–{sl['quick_micro_f1_lower'][-1]})"
        )
    shown = "  ".join(f"{m} drop [lo, hi]" for m in SHOWN)
    lines.append(f"{'candidate':<10}{'champion':<10}{'texts':>6}  verdict  {shown}")
    for p in result["pairs"]:
        if p["champion"] != result["pairs"][0]["champion"]:
            continue
        cells = "  ".join(
            f"{p['intervals'][m]['drop']:+.4f} [{p['intervals'][m]['lower']:+.4f}, {p['intervals'][m]['upper']:+.4f}]"
            for m in SHOWN
            if m in p["intervals"]
        )
        verdict = "passed " if p["passed"] else "REFUSED"
        head = f"{p['candidate']:<10}{p['champion']:<10}{p['texts']:>6}"
        lines.append(f"{head}  {verdict}  {cells}  too small: {p['too_small']}")
    c = result["cost"]
    lines.append(
        f"paired test at {c['texts']:,} texts, {c['labels']} labels, {c['resamples']} resamples: "
        f"{c['patterns']} patterns, counts {c['counts_seconds']} s + bootstrap {c['bootstrap_seconds']} s, "
        f"peak {c['peak_mb']} MB traced; worst case ({c['worst_case_patterns']:,} patterns): "
        f"{c['worst_case_seconds']} s, peak {c['worst_case_peak_mb']} MB"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m seqcls_tools.bench.paired_calibration", description=__doc__.split("\n")[0]
    )
    p.add_argument("--work", type=Path, help="train (or reuse) the checkpoints here")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="the first is the champion")
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--resamples", type=int, default=2000)
    p.add_argument("--cost-texts", type=int, default=COST_TEXTS)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work = args.work or Path(tempfile.mkdtemp(prefix="seqcls-paired-calibration-"))
    work.mkdir(parents=True, exist_ok=True)
    result = calibrate(work, args.seeds, args.sizes, args.resamples, args.cost_texts)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
