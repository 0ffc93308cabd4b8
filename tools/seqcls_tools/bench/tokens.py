"""The corpus through the tokenizers: token lengths, and HF ``tokenizers`` vs PaddleNLP throughput."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from seqcls_tools.bench import measure
from seqcls_tools.bench.plan import Budget

log = logging.getLogger("seqcls_tools.bench")


def corpus_facts(corpus: list[str], checkpoint: Path) -> dict[str, Any]:
    import numpy as np

    from seqcls.serving import shipped

    text_mod = shipped.text()
    tok = text_mod.build_tokenizer(checkpoint / "vocab.txt", lowercase=True, max_length=128)
    lengths = [len(x) for x in text_mod.encode(tok, corpus)]
    chars = [len(t) for t in corpus]
    return {
        "sentences": len(corpus),
        "chars_mean": round(float(np.mean(chars)), 1),
        "chars_min": min(chars),
        "chars_max": max(chars),
        "tokens_mean": round(float(np.mean(lengths)), 1),
        "tokens_p95": int(np.percentile(lengths, 95)),
        "tokens_max": max(lengths),
    }


def tokenizer_benchmark(checkpoint: Path, texts: list[str], budget: Budget, max_length: int = 128) -> dict[str, Any]:
    from paddlenlp.transformers import AutoTokenizer

    from seqcls.serving import shipped

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
