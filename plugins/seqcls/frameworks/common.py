"""What the framework adapters share: the records they return and the workspace view they read.

Kept apart from :mod:`seqcls.frameworks` (the protocol and the adapter table) so an adapter
module can import these while the package's ``__init__`` imports the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Intake:
    """What a framework's checkpoint checks found: the weights file and its tokenizer's facts."""

    weights: Path
    do_lower_case: bool
    vocab_size: int


@dataclass(frozen=True)
class ServingTokenizer:
    """The tokenizer Triton's ``tokenizer`` model runs for this release, and its facts.

    PaddleNLP checkpoints: ``vocab.txt`` (a WordPiece rebuilt to match PaddleNLP, ``seqcls_text.
    build_tokenizer``); transformers checkpoints: the ``tokenizer.json`` export wrote.
    """

    file: Path
    kind: str  # "wordpiece" (vocab.txt) | "tokenizer.json"
    pad_id: int
    do_lower_case: bool

    def build(self, text_mod, max_length: int):
        """The ``tokenizers`` object the server builds from this file (``text_mod``: the shipped seqcls_text)."""
        if self.kind == "tokenizer.json":
            return text_mod.load_tokenizer(self.file, max_length=max_length)
        return text_mod.build_tokenizer(self.file, lowercase=self.do_lower_case, max_length=max_length)


class Records(Protocol):
    """The part of a release workspace an adapter reads back (what its export step recorded).

    :class:`seqcls.release.workspace.Workspace` is one; it is not imported here because the workspace
    resolves checkpoints through the adapters (that import would be a cycle).
    """

    def require(self, name: str, *, hint: str | None = None) -> dict[str, Any]: ...

    def path(self, rel: str) -> Path: ...
