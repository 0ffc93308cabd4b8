"""Build small, real PaddleNLP ERNIE checkpoints without downloading anything.

No pretrained model or vocabulary can be fetched in CI, so tests (and the demo trainer) build
checkpoints from scratch: a vocabulary from the texts at hand, a randomly initialised
``ErnieForSequenceClassification`` of a chosen size, saved exactly the way a PaddleNLP training
job's ``save_pretrained`` writes it, plus ``label.txt``, optional golden texts and, last, the
completion marker (``seqcls.release.completion.mark_complete``) that makes it eligible as ``latest``. This module
is a test seam shipped with the library, so downstream projects can test their DAGs the same way.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]")

#: A small two-level hierarchy in the style of PaddleNLP's hierarchical classification app.
TINY_LABELS = (
    "组织关系",
    "组织关系##裁员",
    "组织关系##加盟",
    "财经",
    "财经##融资",
    "体育",
    "体育##夺冠",
)

#: Texts the tiny vocabulary is built from (so most characters are in-vocabulary).
TINY_CORPUS = (
    "某科技公司宣布裁员百分之十，涉及研发部门。",
    "球队在决赛中夺冠，球迷欢呼庆祝。",
    "初创企业完成新一轮融资，金额达一亿元。",
    "知名主持人加盟新的电视台。",
    "The company announced layoffs of 300 employees in 2024.",
    "Startup raises $20M in Series B funding round!",
    "中国队以3比1战胜对手，获得冠军。",
    "央行宣布降息，股市大涨，投资者信心恢复。",
    "明星球员转会加盟豪门俱乐部，签约五年。",
    "mixed 文本 with English words and 数字 12345 ...",
)


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return 0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0xF900 <= cp <= 0xFAFF


def build_vocab(texts: Iterable[str], *, min_count: int = 1, extra: Iterable[str] = ()) -> list[str]:
    """A WordPiece vocabulary: special tokens, every CJK character, punctuation, digits and
    lower-cased words (with ``##`` continuation pieces for characters) seen in ``texts``."""
    counts: dict[str, int] = {}
    for text in texts:
        for word in _basic_split(text.lower()):
            counts[word] = counts.get(word, 0) + 1
            if len(word) > 1:
                for i, ch in enumerate(word):
                    piece = ch if i == 0 else "##" + ch
                    counts[piece] = counts.get(piece, 0) + 1
    tokens = [t for t, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c >= min_count]
    base = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    base += ["##" + ch for ch in base]
    seen = set(SPECIAL_TOKENS)
    vocab = list(SPECIAL_TOKENS)
    for tok in [*extra, *base, *tokens]:
        if tok and tok not in seen:
            seen.add(tok)
            vocab.append(tok)
    return vocab


def pad_vocab(vocab: list[str], vocab_size: int | None) -> list[str]:
    """``vocab`` padded with ``[unusedN]`` tokens (never produced by the tokenizer) to ``vocab_size``."""
    if vocab_size is None:
        return vocab
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the corpus vocabulary ({len(vocab)} tokens)")
    return vocab + [f"[unused{i}]" for i in range(vocab_size - len(vocab))]


def _basic_split(text: str) -> list[str]:
    """Whitespace + punctuation + CJK split, as BERT's basic tokenizer does (accents stripped)."""
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    out: list[str] = []
    word = ""
    for ch in text:
        if ch.isspace() or _is_cjk(ch) or unicodedata.category(ch).startswith("P") or not ch.isalnum():
            if word:
                out.append(word)
                word = ""
            if not ch.isspace():
                out.append(ch)
        else:
            word += ch
    if word:
        out.append(word)
    return out


def save_checkpoint(
    model: object,
    vocab: Sequence[str],
    labels: Sequence[str],
    out_dir: Path,
    *,
    golden: Sequence[str] | None = None,
    do_lower_case: bool = True,
) -> Path:
    """Write ``model`` + tokenizer + ``label.txt`` (+ ``golden.txt``) as a PaddleNLP job would."""
    from paddlenlp.transformers import ErnieTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_file = out_dir / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = ErnieTokenizer(str(vocab_file), do_lower_case=do_lower_case)
    tokenizer.save_pretrained(str(out_dir))
    model.save_pretrained(str(out_dir))  # type: ignore[attr-defined]
    (out_dir / "label.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    if golden is not None:
        (out_dir / "golden.txt").write_text("\n".join(golden) + "\n", encoding="utf-8")
    return out_dir


def build_tiny_checkpoint(
    out_dir: Path,
    *,
    labels: Sequence[str] = TINY_LABELS,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    max_position: int = 160,
    corpus: Sequence[str] = TINY_CORPUS,
    golden: Sequence[str] | None = None,
    logit_scale: float = 1.0,
    safetensors: bool = False,
    vocab_size: int | None = None,
    complete: bool = True,
) -> Path:
    """A randomly initialised tiny ERNIE classifier saved as a real checkpoint directory.

    ``logit_scale`` multiplies the classifier weights: > 1 spreads probabilities away from 0.5,
    which makes thresholded decisions stable (as a trained model's are). ``vocab_size`` pads the
    vocabulary built from ``corpus`` with synthetic ``[unusedN]`` tokens (never produced by the
    tokenizer) up to that size, for a model with a realistic embedding table. ``complete`` writes
    the completion marker last, as a training job does (``False``: a checkpoint still being written).
    """
    import paddle
    from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification

    paddle.seed(seed)
    vocab = build_vocab(corpus)
    vocab = pad_vocab(vocab, vocab_size)
    config = ErnieConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=hidden_size * 4,
        max_position_embeddings=max_position,
        type_vocab_size=4,
        num_labels=len(labels),
        pad_token_id=0,
    )
    model = ErnieForSequenceClassification(config)
    if logit_scale != 1.0:
        with paddle.no_grad():
            w = model.classifier.weight
            w.set_value(w * logit_scale)
    model.eval()
    save_checkpoint(model, vocab, labels, out_dir, golden=golden)
    if safetensors:
        # PaddleNLP can also write model.safetensors; emulate a job configured that way.
        model.save_pretrained(str(out_dir), safe_serialization=True)
        pd = Path(out_dir) / "model_state.pdparams"
        if (Path(out_dir) / "model.safetensors").exists() and pd.exists():
            pd.unlink()
    if complete:
        from seqcls.release.completion import mark_complete

        mark_complete(out_dir, run=f"seqcls_tools.testing.build_tiny_checkpoint(seed={seed})")
    log.info("built tiny ERNIE checkpoint in %s (%d labels, vocab %d)", out_dir, len(labels), len(vocab))
    return Path(out_dir)
