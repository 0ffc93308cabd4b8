"""Training the demo ERNIE: the encoded splits, the model, the optimiser and the epoch loop.

The loop stops at the epoch limit, after ``patience`` epochs without dev improvement, or when
another epoch would overrun the time budget; :class:`Best` keeps the best-on-dev weights.
:mod:`seqcls_tools.demo.train` orchestrates a run and saves the checkpoint.
"""

from __future__ import annotations

import logging
import math
import random
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqcls_tools.demo import LABELS, load_split
from seqcls_tools.demo.scoring import THRESHOLD, f1_scores, multi_hot, sigmoid
from seqcls_tools.testing import build_vocab

log = logging.getLogger("seqcls_tools.demo.train")

MAX_LENGTH = 128


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


def predict_logits(model: Any, ids: list[list[int]], pad_id: int, batch_size: int = 64) -> np.ndarray:
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


def seed_everything(seed: int) -> None:
    import paddle

    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)


def set_threads(n: int) -> None:
    """Pin Paddle's CPU math threads: more threads than cores only slows a 2-core box down."""
    try:
        from paddle.base import core

        core.set_num_threads(n)
    except (ImportError, AttributeError):  # pragma: no cover - older/newer Paddle layouts
        log.debug("cannot set Paddle CPU threads; using its default")


@dataclass
class Data:
    """The demo splits encoded for training: rows, token ids and multi-hot labels per split."""

    vocab: list[str]
    pad_id: int
    rows: dict[str, list[dict]]
    ids: dict[str, list[list[int]]]
    y: dict[str, np.ndarray]


def load_data() -> Data:
    """The three splits, a vocabulary built from the training texts, and ERNIE's tokenizer over it."""
    from paddlenlp.transformers import ErnieTokenizer

    rows = {name: load_split(name) for name in ("train", "dev", "test")}
    vocab = build_vocab(row["text"] for row in rows["train"])
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp) / "vocab.txt"
        vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
        tokenizer = ErnieTokenizer(str(vocab_file), do_lower_case=True)

    def encode(split: Sequence[dict]) -> list[list[int]]:
        enc = tokenizer([row["text"] for row in split], max_length=MAX_LENGTH, truncation=True)
        return list(enc["input_ids"])

    ids = {name: encode(split) for name, split in rows.items()}
    y = {name: multi_hot(split, LABELS) for name, split in rows.items()}
    return Data(vocab=vocab, pad_id=tokenizer.pad_token_id, rows=rows, ids=ids, y=y)


def build_model(cfg: TrainConfig, data: Data) -> Any:
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification

    config = ErnieConfig(
        vocab_size=len(data.vocab),
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
        pad_token_id=data.pad_id,
    )
    return ErnieForSequenceClassification(config)


def _optimizer(model: Any, cfg: TrainConfig, total_steps: int) -> tuple[Any, Any]:
    """AdamW (no decay on biases and norms, gradients clipped) on a linear warm-up/decay schedule."""
    import paddle
    from paddlenlp.transformers.optimization import LinearDecayWithWarmup

    scheduler = LinearDecayWithWarmup(cfg.learning_rate, total_steps, cfg.warmup_ratio)
    no_decay = {p.name for n, p in model.named_parameters() if "bias" in n or "norm" in n}
    optimizer = paddle.optimizer.AdamW(
        learning_rate=scheduler,
        parameters=model.parameters(),
        weight_decay=cfg.weight_decay,
        apply_decay_param_fun=lambda name: name not in no_decay,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0),
    )
    return optimizer, scheduler


@dataclass
class Best:
    """The best-on-dev weights so far, and how many epochs ran."""

    f1: float = -1.0
    state: dict[str, np.ndarray] | None = None
    epoch: int = 0
    epochs_run: int = 0


@dataclass
class Trainer:
    """One training run: model, optimisation and the shuffling RNG."""

    model: Any
    data: Data
    cfg: TrainConfig
    optimizer: Any
    scheduler: Any
    loss_fn: Any
    rng: np.random.Generator

    def epoch(self) -> float:
        """One pass over the training split in length-bucketed batches; the mean loss."""
        import paddle

        self.model.train()
        train_ids, batch_size = self.data.ids["train"], self.cfg.batch_size
        losses: list[float] = []
        order = _bucketed_order([len(i) for i in train_ids], batch_size, self.rng)
        for idx, arr in _batches(train_ids, order, batch_size, self.data.pad_id):
            x = paddle.to_tensor(arr)
            logits = self.model(input_ids=x, token_type_ids=paddle.zeros_like(x))
            loss = self.loss_fn(logits, paddle.to_tensor(self.data.y["train"][idx]))
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.clear_grad()
            losses.append(float(loss))
        return float(np.mean(losses))

    def dev_f1(self) -> tuple[float, float]:
        dev_probs = sigmoid(predict_logits(self.model, self.data.ids["dev"], self.data.pad_id))
        return f1_scores(self.data.y["dev"], (dev_probs >= THRESHOLD).astype("float32"))


def make_trainer(model: Any, data: Data, cfg: TrainConfig, n_epochs: int, seed: int) -> Trainer:
    import paddle

    steps_per_epoch = math.ceil(len(data.ids["train"]) / cfg.batch_size)
    optimizer, scheduler = _optimizer(model, cfg, steps_per_epoch * n_epochs)
    loss_fn = paddle.nn.BCEWithLogitsLoss()
    return Trainer(model, data, cfg, optimizer, scheduler, loss_fn, np.random.default_rng(seed))


def fit(trainer: Trainer, n_epochs: int, budget: float, started: float) -> Best:
    """Train until ``n_epochs``, ``cfg.patience`` epochs without dev improvement, or the time budget."""
    cfg, data = trainer.cfg, trainer.data
    train_started = time.monotonic()
    log.info(
        "training demo ERNIE: %d train / %d dev / %d test texts, %d labels, vocab %d, "
        "hidden %d x %d layers, up to %d epochs / %.0f s",
        len(data.ids["train"]), len(data.ids["dev"]), len(data.ids["test"]), len(LABELS), len(data.vocab),
        cfg.hidden_size, cfg.num_layers, n_epochs, budget,
    )  # fmt: skip
    best, stale = Best(), 0
    for epoch in range(1, n_epochs + 1):
        loss = trainer.epoch()
        best.epochs_run = epoch
        dev_micro, dev_macro = trainer.dev_f1()
        elapsed = time.monotonic() - started
        log.info(
            "epoch %d/%d loss %.4f dev micro-F1 %.4f macro-F1 %.4f (%.0f s)",
            epoch, n_epochs, loss, dev_micro, dev_macro, elapsed,
        )  # fmt: skip
        if dev_micro > best.f1:
            best.f1, best.epoch, stale = dev_micro, epoch, 0
            best.state = {k: v.numpy().copy() for k, v in trainer.model.state_dict().items()}
        else:
            stale += 1
        if stale >= cfg.patience:
            log.info("dev micro-F1 has not improved for %d epochs; stopping", stale)
            break
        # Stop if another epoch (as long as the average one so far) would overrun the budget.
        if elapsed + (time.monotonic() - train_started) / epoch > budget:
            log.info("time budget of %.0f s reached after %d epochs", budget, epoch)
            break
    return best
