"""The Triton model names of one classifier's ensemble, and the order they load in.

The classic ensemble shape: tokenizer (python) → model (ONNX) → postprocess (python), composed by
an ensemble. Several classifiers share one Triton, so every name derives from the seqcls model
name ``<m>`` (the MLflow model name, ``--model-name``):

==============  ======================  ==========================================
role            Triton name             default model ``seqcls`` (classic names)
==============  ======================  ==========================================
ensemble        ``<m>``                 ``seqcls``
tokenizer       ``<m>_tokenizer``       ``tokenizer``
model           ``<m>_model``           ``seqcls_model``
postprocess     ``<m>_postprocess``     ``seqcls_postprocess``
candidate       ``<m>_candidate``       ``seqcls_candidate``
==============  ======================  ==========================================

The default model keeps the names of the classic repository (and of seqcls before per-model
names), so a repository written by an earlier layout is read as the default model's, unchanged.
Model names ending in a role suffix (``_model``…) or named ``tokenizer`` are refused: they would
collide with another model's composing names. Composing models load before the ensembles that pin
them and unload after them. The candidate route is the ensemble pinned to a release's candidate
version, so unpinned clients of ``<m>`` never reach an un-smoked model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from seqcls.errors import InputError
from seqcls.settings import DEFAULT_MODEL_NAME

#: Triton's rules for a model name as seqcls uses it: a plain directory name of the repository
#: (no separators, no leading dot — Triton skips hidden directories), safe in the KServe-v2 URL
#: path ``/v2/models/<name>`` and in the python backend's shared-memory region names.
TRITON_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}"
ROLE_SUFFIXES = {"tokenizer": "_tokenizer", "model": "_model", "postprocess": "_postprocess", "candidate": "_candidate"}
_TRITON_NAME = re.compile(TRITON_NAME_PATTERN)


@dataclass(frozen=True)
class ServingNames:
    """Triton names of one seqcls model's ensemble (see the module table)."""

    model_name: str
    ensemble: str
    tokenizer: str
    model: str
    postprocess: str
    candidate: str

    @property
    def composing(self) -> tuple[str, str, str]:
        """In ensemble-step (and load) order."""
        return (self.tokenizer, self.model, self.postprocess)

    @property
    def models(self) -> tuple[str, ...]:
        """The four models every published version has, ensemble last."""
        return (*self.composing, self.ensemble)

    @property
    def routes(self) -> tuple[str, str]:
        return (self.ensemble, self.candidate)

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.composing, *self.routes)

    def role(self, triton_name: str) -> str:
        """``tokenizer`` / ``model`` / ``postprocess`` / ``ensemble`` / ``candidate`` of a name of ours."""
        for role in ("tokenizer", "model", "postprocess", "ensemble", "candidate"):
            if getattr(self, role) == triton_name:
                return role
        raise KeyError(f"{triton_name!r} is not one of {self.model_name!r}'s Triton models")

    def source(self, triton_name: str) -> str:
        """The directory of ``model_repository/`` holding this model's templates and python code."""
        role = self.role(triton_name)
        return getattr(CLASSIC, "ensemble" if role == "candidate" else role)


CLASSIC = ServingNames(
    DEFAULT_MODEL_NAME, "seqcls", "tokenizer", "seqcls_model", "seqcls_postprocess", "seqcls_candidate"
)


def names_for(model_name: str) -> ServingNames:
    """The Triton names of ``model_name``'s ensemble; refuses names that would collide or break Triton."""
    if model_name == DEFAULT_MODEL_NAME:
        return CLASSIC
    if not _TRITON_NAME.fullmatch(model_name):
        raise InputError(
            f"model name {model_name!r} is not a valid Triton model name (letters, digits, '_', '.', '-'; "
            "starting with a letter or digit)"
        )
    clash = [s for s in ROLE_SUFFIXES.values() if model_name.endswith(s)] or (
        ["tokenizer"] if model_name in CLASSIC.all else []
    )
    if clash:
        raise InputError(
            f"model name {model_name!r} would collide with the Triton models seqcls derives for other models "
            f"(names ending in {', '.join(ROLE_SUFFIXES.values())} are reserved, and so are "
            f"{', '.join(CLASSIC.all)}); choose another --model-name"
        )
    names = ServingNames(
        model_name,
        model_name,
        *(model_name + ROLE_SUFFIXES[r] for r in ("tokenizer", "model", "postprocess", "candidate")),
    )
    for name in names.all:
        if not _TRITON_NAME.fullmatch(name):
            raise InputError(f"model name {model_name!r}: derived Triton name {name!r} is too long (max 80)")
    return names


# The default model's names, for code and tests that mean the classic ensemble.
ENSEMBLE = CLASSIC.ensemble
TOKENIZER = CLASSIC.tokenizer
MODEL = CLASSIC.model
POSTPROCESS = CLASSIC.postprocess
COMPOSING = CLASSIC.composing
MODELS = CLASSIC.models
CANDIDATE_ENSEMBLE = CLASSIC.candidate
