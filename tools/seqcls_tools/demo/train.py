"""Train the demo classifier: a small ERNIE from scratch on the demo dataset, saved as a real checkpoint.

No pretrained ERNIE can be downloaded here, so the demo trains a few-layer model from random
initialisation on ``seqcls_tools.demo``'s dataset (a couple of minutes on two CPU cores). The result is
saved exactly as a PaddleNLP multi-label training job saves it (``seqcls_tools.testing.save_checkpoint``),
so the release pipeline handles it like any production checkpoint, with:

* ``golden.txt``: held-out texts predicted correctly *and* confidently (no probability within
  ``GOLDEN_MARGIN`` of the 0.5 threshold), so the pipeline's smoke test checks stable decisions
  that small numeric differences after conversion (Paddle -> ONNX -> Triton) cannot flip;
* ``metrics.json``: test F1s, epochs, seconds, seed, and the golden texts' logits.

Usage: ``python -m seqcls_tools.demo.train OUT_DIR [--quick] [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqcls_tools.demo import LABELS
from seqcls_tools.demo.fit import (
    MAX_LENGTH,
    QUICK,
    Best,
    Data,
    TrainConfig,
    build_model,
    fit,
    load_data,
    make_trainer,
    predict_logits,
    seed_everything,
    set_threads,
)
from seqcls_tools.demo.scoring import (
    GOLDEN_MARGIN,
    GOLDEN_MAX,
    GOLDEN_MIN,
    THRESHOLD,
    example_predictions,
    f1_scores,
    select_golden,
    sigmoid,
)
from seqcls_tools.testing import save_checkpoint

__all__ = [
    "GOLDEN_MARGIN",
    "GOLDEN_MAX",
    "GOLDEN_MIN",
    "MAX_LENGTH",
    "QUICK",
    "THRESHOLD",
    "TrainConfig",
    "TrainResult",
    "f1_scores",
    "main",
    "select_golden",
    "train_demo_checkpoint",
]

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a demo training run produced (also written to ``metrics.json`` in ``path``)."""

    path: Path
    micro_f1: float
    macro_f1: float
    epochs: int
    seconds: float
    n_train: int
    n_test: int
    example_predictions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Evaluation:
    """The best model on the test split, and the golden texts chosen from it."""

    probs: np.ndarray
    micro: float
    macro: float
    golden: list[str]
    golden_logits: np.ndarray


def _evaluate_and_save(model: Any, best: Best, data: Data, out_dir: Path) -> _Evaluation:
    """Restore the best weights, score the test split, pick golden texts and save the checkpoint."""
    if best.state is not None:
        model.set_state_dict(best.state)
    model.eval()
    test_ids = data.ids["test"]
    test_probs = sigmoid(predict_logits(model, test_ids, data.pad_id))
    micro, macro = f1_scores(data.y["test"], (test_probs >= THRESHOLD).astype("float32"))
    test_texts = [row["text"] for row in data.rows["test"]]
    golden_idx = select_golden(test_texts, data.y["test"], test_probs, LABELS)
    golden = [test_texts[i] for i in golden_idx]
    save_checkpoint(model, data.vocab, LABELS, out_dir, golden=golden)
    # Logits of each golden text on its own (no padding), as a smoke test would compute them.
    golden_logits = predict_logits(model, [test_ids[i] for i in golden_idx], data.pad_id, batch_size=1)
    return _Evaluation(test_probs, micro, macro, golden, golden_logits)


def _metrics(
    result: TrainResult, best: Best, ev: _Evaluation, data: Data, cfg: TrainConfig, *, seed: int, quick: bool
) -> dict[str, Any]:
    """What ``metrics.json`` records."""
    return {
        "micro_f1": result.micro_f1,
        "macro_f1": result.macro_f1,
        "dev_micro_f1": round(best.f1, 4),
        "best_epoch": best.epoch,
        "epochs": best.epochs_run,
        "seconds": result.seconds,
        "seed": seed,
        "quick": quick,
        "threshold": THRESHOLD,
        "n_train": result.n_train,
        "n_dev": len(data.rows["dev"]),
        "n_test": result.n_test,
        "config": asdict(cfg),
        "golden": [
            {"text": text, "logits": [float(v) for v in logits]}
            for text, logits in zip(ev.golden, ev.golden_logits, strict=True)
        ],
        "example_predictions": result.example_predictions,
    }


def train_demo_checkpoint(
    out_dir: Path,
    *,
    seed: int = 0,
    epochs: int | None = None,
    max_seconds: float | None = None,
    quick: bool = False,
    config: TrainConfig | None = None,
) -> TrainResult:
    """Train the demo ERNIE and save it (plus golden.txt and metrics.json) into ``out_dir``.

    ``epochs`` / ``max_seconds`` override the mode's defaults (24 epochs / 180 s full,
    4 epochs / 40 s quick); training also stops early when dev micro-F1 stops improving, and
    the best-on-dev weights are the ones saved. Training is seeded and runs on the CPU.
    ``config`` replaces the mode's settings entirely (model size, learning rate, ...).
    """
    import paddle

    cfg = config or (QUICK if quick else TrainConfig())
    n_epochs = epochs if epochs is not None else cfg.epochs
    budget = max_seconds if max_seconds is not None else cfg.max_seconds
    out_dir = Path(out_dir)
    started = time.monotonic()

    paddle.set_device("cpu")
    set_threads(cfg.threads)
    seed_everything(seed)

    data = load_data()
    model = build_model(cfg, data)
    best = fit(make_trainer(model, data, cfg, n_epochs, seed), n_epochs, budget, started)
    ev = _evaluate_and_save(model, best, data, out_dir)

    seconds = time.monotonic() - started
    result = TrainResult(
        path=out_dir,
        micro_f1=round(ev.micro, 4),
        macro_f1=round(ev.macro, 4),
        epochs=best.epochs_run,
        seconds=round(seconds, 1),
        n_train=len(data.rows["train"]),
        n_test=len(data.rows["test"]),
        example_predictions=example_predictions(data.rows["test"], ev.probs, LABELS),
    )
    metrics = _metrics(result, best, ev, data, cfg, seed=seed, quick=quick)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, ensure_ascii=False, indent=2) + "\n", "utf-8")
    from seqcls.release.completion import mark_complete

    mark_complete(out_dir, run=f"seqcls_tools.demo.train(seed={seed})")  # last: now it may be `latest`
    log.info(
        "saved demo checkpoint to %s: test micro-F1 %.4f macro-F1 %.4f, %d golden texts, %d epochs, %.0f s",
        out_dir, ev.micro, ev.macro, len(ev.golden), best.epochs_run, seconds,
    )  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train the seqcls demo classifier (small ERNIE, CPU).")
    parser.add_argument("out_dir", type=Path, help="checkpoint directory to write")
    parser.add_argument("--quick", action="store_true", help="train briefly (for tests), not for a demo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--max-seconds", type=float, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = train_demo_checkpoint(
        args.out_dir, seed=args.seed, epochs=args.epochs, max_seconds=args.max_seconds, quick=args.quick
    )
    print(
        f"checkpoint: {result.path}\n"
        f"test micro-F1 {result.micro_f1:.4f}  macro-F1 {result.macro_f1:.4f}  "
        f"({result.epochs} epochs, {result.seconds:.0f} s, {result.n_train} train / {result.n_test} test)"
    )
    for ex in result.example_predictions:
        predicted = ", ".join(f"{label} {p:.3f}" for label, p in ex["predicted"].items()) or "(none)"
        print(f"  {ex['text']}\n    -> {predicted}")


if __name__ == "__main__":
    main()


def checkpoint_or_quick_demo(checkpoint: Path | None, work: Path) -> Path:
    """``checkpoint``, or the quick demo model trained into ``work`` when none is given: the bench
    tools' default, so each runs on a trained classifier without arguments."""
    if checkpoint is not None:
        return checkpoint
    return train_demo_checkpoint(work / "ckpt", quick=True).path
