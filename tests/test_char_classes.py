"""The serving tokenizer's character classes: the single pass over the code points gives exactly the
classes their definitions (PaddleNLP's BasicTokenizer rules, one predicate per class) give."""

from __future__ import annotations

import sys
import unicodedata

from seqcls.contract import shipped


def _reference_class(predicate) -> str:
    """The class of every code point ``predicate`` accepts, one predicate call per code point."""
    points = [cp for cp in range(sys.maxunicode + 1) if not 0xD800 <= cp <= 0xDFFF and predicate(cp)]
    return shipped.text()._char_class(points)


def test_single_pass_classes_equal_the_definitions() -> None:
    text = shipped.text()

    def cat(cp: int) -> str:
        return unicodedata.category(chr(cp))

    def removed(cp: int) -> bool:  # _clean_text: NUL, U+FFFD and control (C*) except \t \n \r
        return cp in (0, 0xFFFD) or (cp not in (9, 10, 13) and cat(cp).startswith("C"))

    def space(cp: int) -> bool:  # _is_whitespace and what str.split() splits on
        return not removed(cp) and (chr(cp).isspace() or cat(cp) == "Zs")

    def split(cp: int) -> bool:  # _is_punctuation (ASCII punctuation, P*) or _is_symbol (S*, a few more)
        ascii_punct = 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
        c = cat(cp)
        return ascii_punct or c.startswith("P") or c.startswith("S") or cp in text._EXTRA_SYMBOLS

    expected = {
        "removed": _reference_class(removed),
        "space": _reference_class(space),
        "split": _reference_class(split),
        "mark": _reference_class(lambda cp: cat(cp) == "Mn"),
    }
    assert text.paddlenlp_char_classes.__wrapped__() == expected
