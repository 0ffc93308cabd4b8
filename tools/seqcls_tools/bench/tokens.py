"""The corpus through the tokenizers: token lengths, and HF ``tokenizers`` vs PaddleNLP throughput."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from seqcls_tools.bench import measure
from seqcls_tools.bench.plan import Budget

log = logging.getLogger("seqcls_tools.bench")


def token_distribution(lengths: list[int]) -> dict[str, Any]:
    """min / median / p95 / max tokens (special tokens included) of some texts: the sequence lengths
    the model runs at, which every speed figure depends on."""
    import numpy as np

    return {
        "texts": len(lengths),
        "min": min(lengths),
        "median": int(np.median(lengths)),
        "p95": int(np.percentile(lengths, 95)),
        "max": max(lengths),
        "mean": round(float(np.mean(lengths)), 1),
    }


def corpus_facts(corpus: list[str], checkpoint: Path, golden: int | None = None) -> dict[str, Any]:
    """Characters and tokens of the corpus (what the load sends), and of its last ``golden`` texts
    (what the release's gate and the batch-dependence check run)."""
    import numpy as np

    from seqcls.contract import shipped

    text_mod = shipped.text()
    tok = text_mod.build_tokenizer(checkpoint / "vocab.txt", lowercase=True, max_length=128)
    lengths = [len(x) for x in text_mod.encode(tok, corpus)]
    chars = [len(t) for t in corpus]
    tokens = token_distribution(lengths)
    out = {
        "sentences": len(corpus),
        "chars_mean": round(float(np.mean(chars)), 1),
        "chars_min": min(chars),
        "chars_max": max(chars),
        "tokens_mean": tokens["mean"],
        "tokens_p95": tokens["p95"],
        "tokens_max": tokens["max"],
        "tokens": tokens,
    }
    if golden:
        out["golden_tokens"] = token_distribution(lengths[-golden:])
    return out


def tokenizer_benchmark(checkpoint: Path, texts: list[str], budget: Budget, max_length: int = 128) -> dict[str, Any]:
    from paddlenlp.transformers import AutoTokenizer

    from seqcls.contract import shipped

    text_mod = shipped.text()
    hf = text_mod.build_tokenizer(checkpoint / "vocab.txt", lowercase=True, max_length=max_length)
    pn = AutoTokenizer.from_pretrained(str(checkpoint))

    def hf_encode(batch: list[str]):
        return text_mod.encode(hf, batch)

    def pn_encode(batch: list[str]):
        return pn(batch, max_length=max_length, truncation=True, padding=False)["input_ids"]

    out: dict[str, Any] = {}
    for name, fn in (("hf", hf_encode), ("paddlenlp", pn_encode)):
        for batch in (1, 8):
            out[f"{name}/batch{batch}"] = measure.tokenizer_throughput(
                fn, texts, batch_size=batch, max_seconds=budget.tokenizer_seconds, max_texts=20000
            )
    log.info(
        "bench: tokenizers — HF %.0f sentences/s, paddlenlp %.0f sentences/s (one text per call)",
        out["hf/batch1"]["sentences_per_s"],
        out["paddlenlp/batch1"]["sentences_per_s"],
    )
    return out
