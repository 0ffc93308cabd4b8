"""What ``int8`` is checked (and static recipes calibrated) on: the release's golden texts,
tokenized and padded exactly as serving does."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.config import ReleaseConfig
from seqcls.contract import shipped
from seqcls.profiles.checks import feeds_for

log = logging.getLogger(__name__)

#: Texts per calibration batch (padded to the batch's longest, as validate batches them).
CALIBRATION_BATCH = 16


@dataclass(frozen=True)
class Calibration:
    """What ``int8`` is calibrated on: texts tokenized exactly as serving tokenizes them (the
    shipped ``seqcls_text`` Triton runs: ``build_tokenizer`` from ``vocab_file``, or
    ``load_tokenizer`` from a checkpoint's own ``tokenizer_file``; ``encode``; padded to the
    batch's longest with the mask from the lengths)."""

    texts: tuple[str, ...]
    source: str
    vocab_file: Path | None
    lowercase: bool = True
    max_length: int = 128
    tokenizer_file: Path | None = None
    pad_id: int | None = None  # None: the tokenizer's [PAD], else 0
    threshold: float = 0.5  # the decision threshold on sigmoid probabilities (logit > logit(threshold))
    min_agreement: float = ReleaseConfig.min_decision_agreement  # the gate's; INT8 must beat it by INT8_MARGIN
    settings: Any = None  # seqcls.settings.Settings: where the serving source is (None: from the env)

    def tokenizer(self, text_mod):
        if self.tokenizer_file is not None:
            return text_mod.load_tokenizer(self.tokenizer_file, max_length=self.max_length)
        return text_mod.build_tokenizer(self.vocab_file, lowercase=self.lowercase, max_length=self.max_length)

    def batches(self, input_names: Sequence[str], batch: int = CALIBRATION_BATCH) -> list[dict[str, np.ndarray]]:
        """The texts as feeds for a graph taking ``input_names``: in padded batches of ``batch``
        (as validate runs them), then each text alone (as a single-text request is served)."""
        text_mod = shipped.text(self.settings)
        tok = self.tokenizer(text_mod)
        ids = text_mod.encode(tok, list(self.texts))
        pad_id = self.pad_id if self.pad_id is not None else (tok.token_to_id("[PAD]") or 0)
        groups = [ids[i : i + batch] for i in range(0, len(ids), batch)] + [[x] for x in ids]
        out = []
        for rows in groups:
            if hasattr(text_mod, "model_feeds"):  # the serving code's own feeds, when it has them
                feeds = text_mod.model_feeds(rows, list(input_names), max_length=self.max_length, pad_id=pad_id)
            else:
                input_ids, _ = text_mod.pad(rows, strategy="longest", max_length=self.max_length, pad_id=pad_id)
                feeds = feeds_for(input_names, input_ids, [len(r) for r in rows])
            out.append(feeds)
        return out


class CalibrationReader:
    """ORT's ``CalibrationDataReader`` protocol over a list of feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self.feeds, self.i = feeds, 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def __len__(self) -> int:
        return len(self.feeds)

    def rewind(self) -> None:
        self.i = 0


def calibration_feeds(
    calibration: Calibration | None, inputs: Sequence[str], synthetic: list[dict[str, np.ndarray]], what: str
) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
    """The feeds ``what`` (an INT8 recipe's name) is checked on: the calibration texts as serving
    feeds them, or (no texts given) ``synthetic``, with a warning; and the facts for the report."""
    if calibration is not None and calibration.texts:
        feeds = calibration.batches(inputs)
        facts = {"source": calibration.source, "texts": len(calibration.texts), "feeds": len(feeds)}
        return feeds, facts
    log.warning("optimize: no calibration texts given — %s checked (and calibrated) on synthetic ids", what)
    return synthetic, {"source": "synthetic ids", "texts": 0, "feeds": len(synthetic)}
