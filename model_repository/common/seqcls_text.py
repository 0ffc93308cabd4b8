"""Serving tokenizer logic, shared by Triton's ``tokenizer`` model and seqcls's parity gate.

This file is copied into every published ``tokenizer`` version (Triton has no ``seqcls``
package) and imported from there by ``model.py``; the release's validate step imports this very
file, so the ids the gate proves equal to PaddleNLP's are the ids the server produces.
Dependencies: numpy and ``tokenizers`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
from seqcls_contract import DEFAULT_BUCKETS, PADDINGS  # shipped alongside; padding strategies explained there

#: Code points PaddleNLP's BasicTokenizer treats as symbols besides Unicode category S*.
_EXTRA_SYMBOLS = (0x00AD, 0x00B2, 0x00BA, 0x3007, 0x00B5, 0x00D8, 0x014B, 0x01B1)
#: :func:`paddlenlp_char_classes` computed once at publish time, shipped in the tokenizer version
#: (computing them walks all 1.1M code points: about a second of every tokenizer stub start).
CHAR_CLASSES_FILE = "seqcls_text_classes.json"
_CLASS_NAMES = ("removed", "space", "split", "mark")


def _char_class(points: list[int]) -> str:
    """A regex character class (``\\x{..}`` ranges) of ``points`` (ascending code points)."""
    ranges, start, prev = [], points[0], points[0]
    for cp in points[1:]:
        if cp != prev + 1:
            ranges.append((start, prev))
            start = cp
        prev = cp
    ranges.append((start, prev))
    return "[" + "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges) + "]"


@lru_cache(maxsize=1)
def paddlenlp_char_classes() -> dict[str, str]:
    """The character classes PaddleNLP's BasicTokenizer uses, from Python's ``unicodedata``.

    HF ``tokenizers`` has its own Unicode tables (another Unicode version) and its BERT
    pre-tokenizer splits on punctuation only, while PaddleNLP also isolates symbols (emoji, ¥,
    €, ©, ...) and drops every ``C*`` character, unassigned code points included. Deriving the
    classes from the same table PaddleNLP consults makes the two agree character for character.
    One pass, one category lookup per code point: every process that builds a tokenizer without
    the shipped table (parity gate, quality gate, the MLflow model) pays it.
    """
    import sys
    import unicodedata

    category, extra = unicodedata.category, set(_EXTRA_SYMBOLS)
    removed: list[int] = []
    space: list[int] = []
    split: list[int] = []
    mark: list[int] = []
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:  # surrogates: not characters
            continue
        ch = chr(cp)
        cat = category(ch)
        head = cat[0]
        if cp in (0, 0xFFFD) or (head == "C" and cp not in (9, 10, 13)):  # _clean_text: NUL, U+FFFD, C* but \t\n\r
            removed.append(cp)
        elif ch.isspace() or cat == "Zs":  # _is_whitespace and what str.split() splits on
            space.append(cp)
        # _is_punctuation (ASCII punctuation, P*) or _is_symbol (S*, and PaddleNLP's few more)
        if head in "PS" or cp in extra or 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
            split.append(cp)
        if cat == "Mn":
            mark.append(cp)
    return {
        "removed": _char_class(removed),
        "space": _char_class(space),
        "split": _char_class(split),
        "mark": _char_class(mark),
    }


def _table_key() -> dict[str, object]:
    """What the classes are a function of: this file's rules and the interpreter's Unicode tables."""
    import sys
    import unicodedata

    return {"unicode": unicodedata.unidata_version, "maxunicode": sys.maxunicode, "extra": list(_EXTRA_SYMBOLS)}


def write_char_classes(path: str | Path) -> Path:
    """Write :func:`paddlenlp_char_classes` (with what they depend on) to ``path`` (JSON)."""
    import json

    path = Path(path)
    table = {**_table_key(), "classes": paddlenlp_char_classes()}
    path.write_text(json.dumps(table, sort_keys=True), encoding="utf-8")
    return path


def read_char_classes(path: str | Path) -> dict[str, str] | None:
    """The classes written by :func:`write_char_classes` — or None when ``path`` is missing, unreadable,
    or was written under other Unicode tables than this interpreter's (then compute them: the
    classes must be exactly what :func:`paddlenlp_char_classes` gives here)."""
    import json

    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
        classes = table["classes"]
        key = {k: table[k] for k in _table_key()}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if key != _table_key() or not isinstance(classes, dict) or sorted(classes) != sorted(_CLASS_NAMES):
        return None
    if not all(isinstance(v, str) and v.startswith("[") and v.endswith("]") for v in classes.values()):
        return None
    return dict(classes)


def build_tokenizer(
    vocab_file: str | Path, *, lowercase: bool = True, max_length: int = 128, classes: dict[str, str] | None = None
):
    """HF ``tokenizers`` WordPiece from the checkpoint's own ``vocab.txt``, matching PaddleNLP.

    Same pipeline as PaddleNLP's ``ErnieTokenizer``/``BertTokenizer``: drop control characters,
    whitespace to spaces, CJK characters split, lower-case + strip accents (NFD, drop Mn), split
    on whitespace, punctuation and symbols, WordPiece (a word over 100 characters → ``[UNK]``),
    ``[CLS] ... [SEP]`` with truncation to ``max_length``. ``classes``: :func:`read_char_classes`'s
    answer, if there is one (default: computed).
    """
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

    classes = classes or paddlenlp_char_classes()
    tokenizer = Tokenizer(models.WordPiece.from_file(str(vocab_file), unk_token="[UNK]", max_input_chars_per_word=100))
    steps = [
        normalizers.Replace(Regex(classes["removed"]), ""),
        normalizers.Replace(Regex(classes["space"]), " "),
        normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=True, strip_accents=False, lowercase=False),
    ]
    if lowercase:
        steps += [normalizers.Lowercase(), normalizers.NFD(), normalizers.Replace(Regex(classes["mark"]), "")]
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex(classes["split"]), behavior="isolated"),
        ]
    )
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    if cls_id is None or sep_id is None:
        raise ValueError(f"{vocab_file}: vocabulary lacks [CLS] or [SEP]")
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", sep_id), ("[CLS]", cls_id))
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    return tokenizer


def load_tokenizer(tokenizer_file: str | Path, *, max_length: int = 128):
    """A checkpoint's own fast tokenizer (``tokenizer.json``, e.g. a transformers checkpoint's),
    truncating to ``max_length`` with its special tokens, unpadded (padding is :func:`pad`'s)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    return tokenizer


def encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids per text (no padding), all texts in one call (the Rust side parallelises)."""
    return [enc.ids for enc in tokenizer.encode_batch(list(texts))]


def encode_counted(tokenizer, texts: Sequence[str]) -> tuple[list[list[int]], int]:
    """:func:`encode`, and how many texts were cut at ``max_length`` (they have overflowing pieces)."""
    encodings = tokenizer.encode_batch(list(texts))
    return [enc.ids for enc in encodings], sum(1 for enc in encodings if enc.overflowing)


def decode_utf8(items: Sequence[object], *, max_bytes: int | None = None) -> tuple[list[str], list[str | None]]:
    """Raw BYTES items → texts; an item that is not valid UTF-8, not bytes at all, or longer than
    ``max_bytes`` gets an error message instead (and ``""`` as its text)."""
    texts: list[str] = []
    errors: list[str | None] = []
    for i, item in enumerate(items):
        text, error = _decode_one(i, item, max_bytes)
        texts.append(text)
        errors.append(error)
    return texts, errors


def _decode_one(i: int, item: object, max_bytes: int | None) -> tuple[str, str | None]:
    if isinstance(item, str):
        try:
            data = item.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 form, the tokenizer would raise
            return "", f"text {i} is not valid Unicode ({exc.reason} at character {exc.start})"
    elif isinstance(item, bytes | bytearray | memoryview):
        data = bytes(item)
    else:  # bytes(5) would be five NUL bytes: refuse anything that is not text
        return "", f"text {i} is {type(item).__name__}, not bytes"
    if max_bytes is not None and len(data) > max_bytes:
        return "", f"text {i} is {len(data)} bytes, over the limit of {max_bytes} bytes (max_text_bytes)"
    if isinstance(item, str):
        return item, None
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return "", f"text {i} is not valid UTF-8 ({exc.reason} at byte {exc.start})"


def padded_length(
    lengths: Sequence[int], *, strategy: str, max_length: int, buckets: Sequence[int] = DEFAULT_BUCKETS
) -> int:
    """The sequence length a batch with these ``lengths`` is padded to."""
    longest = max(lengths) if lengths else 2
    if strategy == "longest":
        return longest
    if strategy == "max_length":
        return max_length
    if strategy == "buckets":
        bounds = sorted({b for b in buckets if b < max_length} | {max_length})
        return next((b for b in bounds if b >= longest), longest)
    raise ValueError(f"unknown padding strategy {strategy!r}; expected one of {PADDINGS}")


def pad(
    ids: Sequence[Sequence[int]],
    *,
    strategy: str = "longest",
    max_length: int = 128,
    pad_id: int = 0,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
) -> tuple[np.ndarray, np.ndarray]:
    """``input_ids`` and ``token_type_ids`` (int64 ``[N, L]``) for a list of id sequences."""
    length = padded_length([len(x) for x in ids], strategy=strategy, max_length=max_length, buckets=buckets)
    input_ids = np.full((len(ids), length), pad_id, dtype=np.int64)
    for row, seq in enumerate(ids):
        input_ids[row, : len(seq)] = seq[:length]
    return input_ids, np.zeros_like(input_ids)


def model_feeds(
    ids: Sequence[Sequence[int]],
    names: Sequence[str],
    *,
    strategy: str = "longest",
    max_length: int = 128,
    pad_id: int = 0,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
) -> dict[str, np.ndarray]:
    """The tensors a graph taking ``names`` (a subset of ``input_ids``, ``token_type_ids``,
    ``attention_mask``) is fed for these id sequences: padded as :func:`pad` does, the mask 1 on
    each text's own tokens and 0 on padding (from the lengths, never from the pad id)."""
    input_ids, type_ids = pad(ids, strategy=strategy, max_length=max_length, pad_id=pad_id, buckets=buckets)
    lengths = np.array([min(len(x), input_ids.shape[1]) for x in ids], dtype=np.int64).reshape(-1, 1)
    mask = (np.arange(input_ids.shape[1], dtype=np.int64)[None, :] < lengths).astype(np.int64)
    tensors = {"input_ids": input_ids, "token_type_ids": type_ids, "attention_mask": mask}
    unknown = [n for n in names if n not in tensors]
    if unknown:
        raise ValueError(f"unknown model input(s) {unknown}; expected a subset of {sorted(tensors)}")
    return {n: tensors[n] for n in names}
