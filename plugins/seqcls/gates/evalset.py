"""A labeled evaluation set: read once, hashed, every line checked before any model sees it.

The quality gate compares a candidate with the served champion *on the same labeled texts*, so the
set is evidence: :attr:`EvalSet.sha256` is the hash of exactly the bytes that were parsed (the file
is read once and never re-read), and the run records it. Two formats, chosen by the file's suffix:

- ``.jsonl`` / ``.json``: JSON Lines, one object per line ``{"text": str, "labels": [str, ...]}``
  (other keys ignored);
- anything else (``.txt``, ``.tsv``): PaddleNLP's hierarchical-classification format
  ``text<TAB>label,label`` (``train.txt`` / ``dev.txt``), labels comma-separated, hierarchy joined
  with ``##``, an empty label part meaning "no label".

Like PaddleNLP's ``read_local_dataset`` the TSV reader takes the labels after the *last* tab and
joins the parts before it without the tabs, and strips the text; so a checkpoint's ``dev.txt`` is
scored on the texts its training job evaluated. Unlike it, a line without a tab is refused (a text
PaddleNLP would read as unlabeled is almost always a typo: spaces instead of the tab), and so is a
label the checkpoint does not know (PaddleNLP fails with a bare ``KeyError``). CRLF line endings, a
UTF-8 byte-order mark and blank lines are accepted, as in the checkpoint's own text files.
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import json
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqcls.errors import InputError
from seqcls.settings import ENV_EVAL_SET_MAX_MB, ENV_EVAL_SET_MAX_TEXTS

log = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".json")
BOM_BYTES = b"\xef\xbb\xbf"
TSV_EXPECTED = 'expected "text<TAB>label,label" (PaddleNLP\'s format; "text<TAB>" for a text with no label)'
JSONL_EXPECTED = 'expected one JSON object per line: {"text": "...", "labels": ["...", ...]}'


@dataclass(frozen=True)
class EvalSet:
    """Labeled texts and the evidence of where they came from (path, hash of the parsed bytes)."""

    path: Path
    sha256: str
    format: str  # "tsv" | "jsonl"
    source: str
    texts: tuple[str, ...]
    labels: tuple[tuple[str, ...], ...]

    def summary(self) -> dict[str, Any]:
        """What a run records about the set (no texts: they may be private)."""
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "texts": len(self.texts),
            "format": self.format,
            "source": self.source,
        }


def format_of(path: Path) -> str:
    """``"jsonl"`` for ``.jsonl`` / ``.json``, else ``"tsv"`` (PaddleNLP's ``text<TAB>label,label``)."""
    return "jsonl" if Path(path).suffix.lower() in JSONL_SUFFIXES else "tsv"


class _LabelChecker:
    """Checks one gold label against the label space; the message suggests the nearest known label."""

    def __init__(self, where: Path, known_labels: Sequence[str]) -> None:
        self.where = where
        self.known = tuple(known_labels)
        self.known_set = frozenset(self.known)

    def check(self, label: str, line: int) -> str:
        if label in self.known_set:
            return label
        close = difflib.get_close_matches(label, self.known, n=1)
        some = ", ".join(map(repr, self.known[:5]))
        hint = f"did you mean {close[0]!r}?" if close else f"known labels include {some}"
        raise InputError(
            f"{self.where}: line {line}: unknown label {label!r} (not in the checkpoint's {len(self.known)} labels; "
            f"{hint}). Fix the label, or evaluate with the checkpoint that was trained on it."
        )

    def labels(self, values: Sequence[str], line: int) -> tuple[str, ...]:
        """``values`` checked, in the order written, duplicates removed."""
        return tuple(dict.fromkeys(self.check(v, line) for v in values))


def _decode(data: bytes, where: Path) -> str:
    """UTF-8 text without a leading byte-order mark; a bad byte is named by offset and line."""
    body = data.removeprefix(BOM_BYTES)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = exc.start + (len(data) - len(body))
        line = data[:offset].count(b"\n") + 1
        raise InputError(
            f"{where}: not UTF-8 text: byte 0x{data[offset]:02x} at offset {offset} (line {line}) is invalid "
            f"({exc.reason}); save the file as UTF-8."
        ) from exc


def _lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line without its LF / CRLF) for every non-blank line.

    Split on ``\\n`` only: ``str.splitlines`` would also split inside a text at U+2028, U+0085, form
    feeds…, and the line numbers in messages would stop matching an editor's.
    """
    out = []
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if line.strip():
            out.append((number, line))
    return out


def _shown(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: a message names the value, it does not dump it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check_text(text: str, where: Path, line: int, max_text_bytes: int | None) -> str:
    if not text.strip():
        raise InputError(f"{where}: line {line}: the text is empty; every line needs a text to classify.")
    if max_text_bytes is not None and (size := len(text.encode("utf-8"))) > max_text_bytes:
        raise InputError(
            f"{where}: line {line}: the text is {size} bytes, longer than the {max_text_bytes} bytes the server "
            f"accepts for one text ({_shown(text, 40)}); shorten it or remove that line."
        )
    return text


def _tsv_row(line: str, number: int, where: Path, checker: _LabelChecker) -> tuple[str, tuple[str, ...]]:
    parts = line.split("\t")
    if len(parts) == 1:
        raise InputError(f"{where}: line {number} has no tab: {TSV_EXPECTED}; found {_shown(line)}.")
    text = "".join(parts[:-1]).strip()
    field = parts[-1].strip()
    if not field:
        return text, ()
    values = [v.strip() for v in field.split(",")]
    if not all(values):
        raise InputError(
            f"{where}: line {number}: empty label in {_shown(field)}: labels are separated by single commas, "
            "with no comma before, after or doubled."
        )
    return text, checker.labels(values, number)


def _jsonl_row(line: str, number: int, where: Path, checker: _LabelChecker) -> tuple[str, tuple[str, ...]]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        hint = " (a JSON array or a pretty-printed document is not JSON Lines)" if line.strip() in "[{" else ""
        raise InputError(
            f"{where}: line {number}: invalid JSON at column {exc.colno} ({exc.msg}){hint}: {JSONL_EXPECTED}."
        ) from exc
    if not isinstance(obj, dict):
        raise InputError(f"{where}: line {number}: a JSON {type(obj).__name__}, not an object: {JSONL_EXPECTED}.")
    text = obj.get("text")
    if not isinstance(text, str):
        raise InputError(f'{where}: line {number}: "text" is {_shown(text)}, not a string: {JSONL_EXPECTED}.')
    labels = obj.get("labels")
    if not isinstance(labels, list) or not all(isinstance(v, str) and v.strip() for v in labels):
        raise InputError(
            f'{where}: line {number}: "labels" is {_shown(labels)}, not a list of non-empty strings '
            f"([] for a text with no label): {JSONL_EXPECTED}."
        )
    return text.strip(), checker.labels([v.strip() for v in labels], number)


@dataclass(frozen=True)
class Limits:
    """How much evidence a release's eval set may and must hold: the bytes and texts a worker parses and
    scores (the deployment's: ``SEQCLS_EVAL_SET_MAX_*``), and the fewest texts a verdict is taken on
    (the release's ``min_eval_texts``). Checked before the texts are scored: in seconds, in bounded memory."""

    max_bytes: int | None = None
    max_texts: int | None = None
    min_texts: int = 1


def parse_eval_set(
    data: bytes,
    where: Path,
    known_labels: Sequence[str],
    *,
    source: str = "configured",
    max_text_bytes: int | None = None,
    limits: Limits = Limits(),
) -> EvalSet:
    """The eval set in ``data`` (the bytes of the file ``where``; its suffix picks the format).

    Every gold label must be one of ``known_labels`` (the candidate checkpoint's): a label the
    model cannot predict would count as a miss for every model alike and hide real differences.
    """
    where = Path(where)
    fmt = format_of(where)
    checker = _LabelChecker(where, known_labels)
    row = _jsonl_row if fmt == "jsonl" else _tsv_row
    texts: list[str] = []
    labels: list[tuple[str, ...]] = []
    for number, line in _lines(_decode(data, where)):
        if limits.max_texts is not None and len(texts) >= limits.max_texts:
            raise InputError(
                f"{where}: more than {limits.max_texts} labeled texts (line {number} is one too many), the most a "
                f"release scores ({ENV_EVAL_SET_MAX_TEXTS}): evaluate on a sample of it, or raise the limit where "
                "the workers have the memory and time for it."
            )
        text, gold = row(line, number, where, checker)
        texts.append(_check_text(text, where, number, max_text_bytes))
        labels.append(gold)
    if not texts:
        expected = JSONL_EXPECTED if fmt == "jsonl" else TSV_EXPECTED
        raise InputError(f"{where}: has no texts ({len(data)} bytes); {expected}.")
    if len(texts) < limits.min_texts:
        raise InputError(
            f"{where}: {len(texts)} labeled text(s), fewer than the {limits.min_texts} a quality verdict is taken on "
            "(min_eval_texts): a set this small cannot tell a worse model from noise. Add labeled texts; lowering "
            "min_eval_texts loosens the gate."
        )
    return EvalSet(where, hashlib.sha256(data).hexdigest(), fmt, source, tuple(texts), tuple(labels))


def read_once(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``path``, from one open (no symlink as its last component); refused
    before reading when it is larger than ``max_bytes`` (``SEQCLS_EVAL_SET_MAX_MB``)."""
    what = "the labeled evaluation set (eval_set)"
    try:
        # O_NONBLOCK: opening a FIFO must not hang the step; it has no effect on a regular file
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise InputError(f"{path}: no such file — {what}; give the path of an existing file.") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise InputError(
                f"{path}: is a symbolic link; {what} is read only from the file itself — give its real path."
            ) from exc
        raise InputError(f"{path}: cannot be opened ({exc.strerror}) — {what}; fix its permissions.") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise InputError(f"{path}: is not a regular file — {what} must be a plain file.")
    with open(fd, "rb") as fh:
        if max_bytes is not None and info.st_size > max_bytes:
            raise InputError(_too_big(path, info.st_size, max_bytes))
        try:
            data = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
        except OSError as exc:
            raise InputError(f"{path}: cannot be read ({exc.strerror}) — {what}.") from exc
    if max_bytes is not None and len(data) > max_bytes:  # it grew while being read
        raise InputError(_too_big(path, len(data), max_bytes))
    return data


def _too_big(path: Path, size: int, max_bytes: int) -> str:
    return (
        f"{path}: {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.0f} MB an eval set may have ({ENV_EVAL_SET_MAX_MB}): "
        "evaluate on a sample of it, or raise the limit where the workers have the memory and time for it."
    )


def read_eval_set(
    path: Path,
    known_labels: Sequence[str],
    *,
    source: str = "configured",
    max_text_bytes: int | None = None,
) -> EvalSet:
    """Read ``path`` once and parse exactly those bytes (what is hashed is what is scored)."""
    path = Path(path)
    data = read_once(path)
    got = parse_eval_set(data, path, known_labels, source=source, max_text_bytes=max_text_bytes)
    log.info("eval set %s (%s, %s): %d texts, sha256 %s", path, got.format, source, len(got.texts), got.sha256[:16])
    return got
