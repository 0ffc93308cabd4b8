"""Framework adapters: what differs between a PaddleNLP and a Hugging Face ``transformers`` checkpoint.

One adapter per framework behind one small protocol (:class:`Framework`), chosen once from the
checkpoint — :func:`detect` from ``config.json`` at intake, :func:`for_checkpoint` afterwards from
the name the :class:`~seqcls.checkpoints.checkpoint.Checkpoint` records — the way MLflow's
flavors and Model Navigator's runners are. Everything else (steps, gates, registry, serving)
asks the adapter instead of branching on the framework. Adapters: :data:`PADDLE`
(:mod:`.paddle`), :data:`TRANSFORMERS` (:mod:`.transformers`); both import their framework's
libraries (heavy, optional) only inside the functions that need them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from seqcls.checkpoints.checkpoint import Checkpoint
from seqcls.config import ReleaseConfig
from seqcls.errors import CheckpointError
from seqcls.frameworks.common import Intake, Records, ServingTokenizer
from seqcls.frameworks.paddle import PADDLE
from seqcls.frameworks.transformers import TRANSFORMERS
from seqcls.settings import Settings


class Framework(Protocol):
    """What a release asks of the framework that trained its checkpoint."""

    #: The name a checkpoint, a manifest, MLflow tags and ``release.json`` record ("paddle", "transformers").
    name: str
    #: What the served graph is compared with, as the gate's titles and messages name it ("Paddle", "PyTorch").
    reference_runtime: str
    #: The MLflow artifact directory the exported files are logged under.
    artifact_dir: str
    #: The files whose bytes define the model (hashed into the fingerprint when present).
    model_files: tuple[str, ...]
    #: The distributions that export and check its releases (their versions become MLflow tags).
    packages: tuple[str, ...]

    def check_checkpoint(self, root: Path, config: dict, *, allow_unsafe_pickle: bool = False) -> Intake:
        """The framework's intake checks (weights it may read, its tokenizer), cheap: no framework import."""
        ...

    def serving_tokenizer(self, ckpt: Checkpoint, records: Records) -> ServingTokenizer:
        """The tokenizer file Triton serves for a release of ``ckpt`` (``records``: its workspace)."""
        ...

    def export_inputs(self, ckpt: Checkpoint, config: ReleaseConfig, settings: Settings) -> dict[str, Any]:
        """What the export depends on (a change re-runs it); fails fast when the framework is missing."""
        ...

    def export(
        self, ckpt: Checkpoint, out: Path, *, rel: str, config: ReleaseConfig, settings: Settings
    ) -> tuple[dict[str, Any], str]:
        """Export into ``out`` (``rel`` inside the workspace): the step's summary and its one-line message."""
        ...

    def exported_onnx(self, summary: dict[str, Any]) -> str | None:
        """The ONNX file the export wrote (workspace-relative), or None: convert runs paddle2onnx."""
        ...

    def reference_ids(self, ckpt: Checkpoint, texts: Sequence[str], max_length: int) -> tuple[list[list[int]], str]:
        """Token ids from the framework's own tokenizer, and which tokenizer gave them."""
        ...

    def reference_logits(
        self, ckpt: Checkpoint, exported: Path, ids: Sequence[Sequence[int]], *, input_names: Sequence[str], pad_id: int
    ) -> np.ndarray:
        """The framework's own logits on ``ids`` (``exported``: the export step's directory)."""
        ...

    def version_facts(self) -> dict[str, str]:
        """The framework's library versions, as the export summary records them."""
        ...


#: Every adapter, in the order their files are listed (PaddleNLP first: seqcls's default).
FRAMEWORKS: tuple[Framework, ...] = (PADDLE, TRANSFORMERS)
BY_NAME: dict[str, Framework] = {f.name: f for f in FRAMEWORKS}


def by_name(name: str) -> Framework:
    """The adapter a checkpoint (or a record of one) names."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown framework {name!r}; expected one of {sorted(BY_NAME)}") from None


def for_checkpoint(ckpt: Checkpoint) -> Framework:
    """The adapter of the framework that saved ``ckpt``."""
    return by_name(ckpt.framework)


def detect(config: dict, path: Path) -> Framework:
    """Which library saved the checkpoint, from the key each one's ``save_pretrained`` writes into
    ``config.json`` (``transformers_version`` / ``paddlenlp_version``); a config with neither is
    PaddleNLP's older format (seqcls's default), one with both is refused."""
    hf, paddle = "transformers_version" in config, "paddlenlp_version" in config
    if hf and paddle:
        raise CheckpointError(
            f"{path}: has both transformers_version and paddlenlp_version, so seqcls cannot tell which "
            "framework saved it; remove the key of the library that did not write this checkpoint."
        )
    return TRANSFORMERS if hf else PADDLE


__all__ = [
    "BY_NAME",
    "FRAMEWORKS",
    "PADDLE",
    "TRANSFORMERS",
    "Framework",
    "Intake",
    "Records",
    "ServingTokenizer",
    "by_name",
    "detect",
    "for_checkpoint",
]
