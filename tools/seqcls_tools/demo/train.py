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
import math
import random
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqcls_tools.demo import LABELS, load_split
from seqcls_tools.testing import build_vocab, save_checkpoint

log = logging.getLogger(__name__)

MAX_LENGTH = 128
THRESHOLD = 0.5
#: Golden texts keep every probability at least this far from THRESHOLD.
GOLDEN_MARGIN = 0.1
GOLDEN_MAX = 32
GOLDEN_MIN = 24


@dataclass(frozen=True)
class TrainConfig:
    """Model size and optimisation settings; the defaults take ~2-3 minutes on two CPU cores.

    Training from scratch on ~1,200 texts: a wider initialisation than BERT's 0.02 and small
    batches (more updates per second on a CPU) get the model past the "predict the label
    priors" plateau within a couple of epochs instead of dozens.
    """

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    max_position: int = 512
    initializer_range: float = 0.05
    dropout: float = 0.1
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    batch_size: int = 16
    epochs: int = 24
    max_seconds: float = 180.0
    patience: int = 10
    threads: int = 2


#: ``quick=True``: just enough training for tests (tens of seconds); no dropout and a wider init
#: make 4 epochs reach a usable model (test micro-F1 ~0.9) at the cost of some generalisation.
QUICK = TrainConfig(epochs=4, max_seconds=40.0, dropout=0.0, initializer_range=0.1)


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


def f1_scores(gold: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """(micro, macro) F1 of 0/1 matrices ``[n_texts, n_labels]``; a label never gold nor
    predicted counts as F1 1.0 in the macro average (nothing to get wrong)."""
    tp = (gold * pred).sum(axis=0).astype(float)
    fp = ((1 - gold) * pred).sum(axis=0).astype(float)
    fn = (gold * (1 - pred)).sum(axis=0).astype(float)
    denom = 2 * tp.sum() + fp.sum() + fn.sum()
    micro = float(2 * tp.sum() / denom) if denom else 1.0
    per_label = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 1.0)
    return micro, float(per_label.mean())


def _multi_hot(rows: Sequence[dict], labels: Sequence[str]) -> np.ndarray:
    index = {label: i for i, label in enumerate(labels)}
    out = np.zeros((len(rows), len(labels)), dtype="float32")
    for r, row in enumerate(rows):
        for label in row["labels"]:
            out[r, index[label]] = 1.0
    return out


def _batches(
    ids: list[list[int]], order: Sequence[int], batch_size: int, pad_id: int
) -> Iterator[tuple[list[int], np.ndarray]]:
    """(indices, padded input_ids) per batch; padding is masked by ERNIE (pad_token_id)."""
    for start in range(0, len(order), batch_size):
        idx = list(order[start : start + batch_size])
        width = max(len(ids[i]) for i in idx)
        arr = np.full((len(idx), width), pad_id, dtype="int64")
        for row, i in enumerate(idx):
            arr[row, : len(ids[i])] = ids[i]
        yield idx, arr


def _bucketed_order(lengths: Sequence[int], batch_size: int, rng: np.random.Generator) -> list[int]:
    """A shuffled order whose batches hold texts of similar length.

    Step time on the CPU grows steeply with the padded width, and a random batch is padded to its
    longest (two-event) text; sorting within shuffled pools of a few batches keeps padding small
    while batches (and their order) stay random.
    """
    order = rng.permutation(len(lengths))
    pool = batch_size * 8
    batches: list[list[int]] = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool].tolist(), key=lambda i: lengths[i])
        batches += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
    return [i for b in rng.permutation(len(batches)) for i in batches[b]]


def _predict_logits(model: Any, ids: list[list[int]], pad_id: int, batch_size: int = 64) -> np.ndarray:
    """Logits in input order (batched by length for speed; padding is masked, so it is exact)."""
    import paddle

    model.eval()
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = np.zeros((len(ids), model.config.num_labels), dtype="float32")
    with paddle.no_grad():
        for idx, arr in _batches(ids, order, batch_size, pad_id):
            x = paddle.to_tensor(arr)
            out[idx] = model(input_ids=x, token_type_ids=paddle.zeros_like(x)).numpy()
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _seed_everything(seed: int) -> None:
    import paddle

    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)


def _set_threads(n: int) -> None:
    """Pin Paddle's CPU math threads: more threads than cores only slows a 2-core box down."""
    try:
        from paddle.base import core

        core.set_num_threads(n)
    except (ImportError, AttributeError):  # pragma: no cover - older/newer Paddle layouts
        log.debug("cannot set Paddle CPU threads; using its default")


def select_golden(
    texts: Sequence[str],
    gold: np.ndarray,
    probs: np.ndarray,
    labels: Sequence[str],
    *,
    limit: int = GOLDEN_MAX,
    margin: float = GOLDEN_MARGIN,
) -> list[int]:
    """Indices of held-out texts for the smoke test: correct and confident, spread over labels.

    Candidates are exact-match predictions with no probability within ``margin`` of 0.5. They
    are queued by their leaf label (two-branch texts get a queue of their own) and taken
    round-robin, most confident first, so every label gets checked. If too few qualify (an
    under-trained quick run) the most confident remaining texts top the list up to
    ``GOLDEN_MIN``: the pipeline needs stable decisions more than correct ones.
    """
    pred = (probs >= THRESHOLD).astype("float32")
    confidence = np.abs(probs - THRESHOLD).min(axis=1)
    exact = (pred == gold).all(axis=1)
    candidates = [i for i in range(len(texts)) if exact[i] and confidence[i] >= margin]
    candidates.sort(key=lambda i: (-confidence[i], i))
    by_key: dict[int, list[int]] = {}
    for i in candidates:
        leaves = [int(j) for j in np.flatnonzero(gold[i]) if "##" in labels[j]]
        key = leaves[0] if len(leaves) == 1 else -1  # -1: several events (or none)
        by_key.setdefault(key, []).append(i)
    chosen: list[int] = []
    queues = [by_key[k] for k in sorted(by_key)]
    while len(chosen) < limit and any(queues):
        for queue in queues:
            if queue and len(chosen) < limit:
                chosen.append(queue.pop(0))
    if len(chosen) < GOLDEN_MIN:
        log.warning("only %d confident correct held-out texts; topping up golden.txt", len(chosen))
        rest = sorted((i for i in range(len(texts)) if i not in chosen), key=lambda i: (-confidence[i], i))
        chosen += rest[: max(0, GOLDEN_MIN - len(chosen))]
    return chosen


def _examples(rows: Sequence[dict], probs: np.ndarray, labels: Sequence[str], n: int = 5) -> list[dict]:
    """A few test predictions for the README/log: one two-branch text, one English, then others."""
    picks: list[int] = []
    two_branch = [i for i, r in enumerate(rows) if len({lb.split("##")[0] for lb in r["labels"]}) > 1]
    english = [i for i, r in enumerate(rows) if r["text"].isascii()]
    for i in [*two_branch[:1], *english[:1], *range(len(rows))]:
        if i not in picks:
            picks.append(i)
        if len(picks) == n:
            break
    return [
        {
            "text": rows[i]["text"],
            "gold": rows[i]["labels"],
            "predicted": {
                labels[j]: round(float(probs[i, j]), 4) for j in np.argsort(-probs[i]) if probs[i, j] >= THRESHOLD
            },
        }
        for i in picks
    ]


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
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification, ErnieTokenizer
    from paddlenlp.transformers.optimization import LinearDecayWithWarmup

    cfg = config or (QUICK if quick else TrainConfig())
    n_epochs = epochs if epochs is not None else cfg.epochs
    budget = max_seconds if max_seconds is not None else cfg.max_seconds
    out_dir = Path(out_dir)
    started = time.monotonic()

    paddle.set_device("cpu")
    _set_threads(cfg.threads)
    _seed_everything(seed)

    train_rows, dev_rows, test_rows = (load_split(name) for name in ("train", "dev", "test"))
    vocab = build_vocab(row["text"] for row in train_rows)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp) / "vocab.txt"
        vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
        tokenizer = ErnieTokenizer(str(vocab_file), do_lower_case=True)

    def encode(rows: Sequence[dict]) -> list[list[int]]:
        enc = tokenizer([row["text"] for row in rows], max_length=MAX_LENGTH, truncation=True)
        return list(enc["input_ids"])

    train_ids, dev_ids, test_ids = encode(train_rows), encode(dev_rows), encode(test_rows)
    y_train, y_dev, y_test = (_multi_hot(rows, LABELS) for rows in (train_rows, dev_rows, test_rows))
    pad_id = tokenizer.pad_token_id

    config = ErnieConfig(
        vocab_size=len(vocab),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.hidden_size * 4,
        max_position_embeddings=cfg.max_position,
        type_vocab_size=4,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout,
        initializer_range=cfg.initializer_range,
        num_labels=len(LABELS),
        pad_token_id=pad_id,
    )
    model = ErnieForSequenceClassification(config)
    steps_per_epoch = math.ceil(len(train_ids) / cfg.batch_size)
    total_steps = steps_per_epoch * n_epochs
    scheduler = LinearDecayWithWarmup(cfg.learning_rate, total_steps, cfg.warmup_ratio)
    no_decay = {p.name for n, p in model.named_parameters() if "bias" in n or "norm" in n}
    optimizer = paddle.optimizer.AdamW(
        learning_rate=scheduler,
        parameters=model.parameters(),
        weight_decay=cfg.weight_decay,
        apply_decay_param_fun=lambda name: name not in no_decay,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0),
    )
    loss_fn = paddle.nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(seed)
    train_started = time.monotonic()
    log.info(
        "training demo ERNIE: %d train / %d dev / %d test texts, %d labels, vocab %d, "
        "hidden %d x %d layers, up to %d epochs / %.0f s",
        len(train_ids), len(dev_ids), len(test_ids), len(LABELS), len(vocab),
        cfg.hidden_size, cfg.num_layers, n_epochs, budget,
    )  # fmt: skip

    best_f1, best_state, best_epoch, stale, done = -1.0, None, 0, 0, 0
    for epoch in range(1, n_epochs + 1):
        model.train()
        losses: list[float] = []
        order = _bucketed_order([len(i) for i in train_ids], cfg.batch_size, rng)
        for idx, arr in _batches(train_ids, order, cfg.batch_size, pad_id):
            x = paddle.to_tensor(arr)
            logits = model(input_ids=x, token_type_ids=paddle.zeros_like(x))
            loss = loss_fn(logits, paddle.to_tensor(y_train[idx]))
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.clear_grad()
            losses.append(float(loss))
        done = epoch
        dev_probs = _sigmoid(_predict_logits(model, dev_ids, pad_id))
        dev_micro, dev_macro = f1_scores(y_dev, (dev_probs >= THRESHOLD).astype("float32"))
        elapsed = time.monotonic() - started
        log.info(
            "epoch %d/%d loss %.4f dev micro-F1 %.4f macro-F1 %.4f (%.0f s)",
            epoch, n_epochs, float(np.mean(losses)), dev_micro, dev_macro, elapsed,
        )  # fmt: skip
        if dev_micro > best_f1:
            best_f1, best_epoch, stale = dev_micro, epoch, 0
            best_state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        else:
            stale += 1
        if stale >= cfg.patience:
            log.info("dev micro-F1 has not improved for %d epochs; stopping", stale)
            break
        # Stop if another epoch (as long as the average one so far) would overrun the budget.
        if elapsed + (time.monotonic() - train_started) / epoch > budget:
            log.info("time budget of %.0f s reached after %d epochs", budget, epoch)
            break

    if best_state is not None:
        model.set_state_dict(best_state)
    model.eval()
    test_logits = _predict_logits(model, test_ids, pad_id)
    test_probs = _sigmoid(test_logits)
    micro, macro = f1_scores(y_test, (test_probs >= THRESHOLD).astype("float32"))

    test_texts = [row["text"] for row in test_rows]
    golden_idx = select_golden(test_texts, y_test, test_probs, LABELS)
    golden = [test_texts[i] for i in golden_idx]
    save_checkpoint(model, vocab, LABELS, out_dir, golden=golden)
    # Logits of each golden text on its own (no padding), as a smoke test would compute them.
    golden_logits = _predict_logits(model, [test_ids[i] for i in golden_idx], pad_id, batch_size=1)

    seconds = time.monotonic() - started
    result = TrainResult(
        path=out_dir,
        micro_f1=round(micro, 4),
        macro_f1=round(macro, 4),
        epochs=done,
        seconds=round(seconds, 1),
        n_train=len(train_rows),
        n_test=len(test_rows),
        example_predictions=_examples(test_rows, test_probs, LABELS),
    )
    metrics = {
        "micro_f1": result.micro_f1,
        "macro_f1": result.macro_f1,
        "dev_micro_f1": round(best_f1, 4),
        "best_epoch": best_epoch,
        "epochs": done,
        "seconds": result.seconds,
        "seed": seed,
        "quick": quick,
        "threshold": THRESHOLD,
        "n_train": result.n_train,
        "n_dev": len(dev_rows),
        "n_test": result.n_test,
        "config": asdict(cfg),
        "golden": [
            {"text": text, "logits": [float(v) for v in logits]}
            for text, logits in zip(golden, golden_logits, strict=True)
        ],
        "example_predictions": result.example_predictions,
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, ensure_ascii=False, indent=2) + "\n", "utf-8")
    log.info(
        "saved demo checkpoint to %s: test micro-F1 %.4f macro-F1 %.4f, %d golden texts, %d epochs, %.0f s",
        out_dir, micro, macro, len(golden), done, seconds,
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
