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

A name is checked once, where it enters (a CLI flag, a DAG param, the models file, a file name found in
the repository): :class:`ModelName` is that check, and the value it makes carries every derived name
(:attr:`ModelName.names`). Inner floors take the value; what builds a path from a name requires it
(:func:`require_name`), so an unchecked string can never name a file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from seqcls.errors import InputError
from seqcls.settings import DEFAULT_MODEL_NAME

#: A seqcls model name: the MLflow registered model, the release workspace's directory, the Triton
#: ensemble — so no path separator, no ``..``, at most 64 characters.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_MODEL_NAME = re.compile(MODEL_NAME_PATTERN.strip("^$"))
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


class ModelName(str):
    """A model name checked once, where it enters; the value carries every Triton name derived from it.

    ``ModelName(text)`` refuses (InputError) a name that could escape the release home or break
    Triton/MLflow naming, or whose derived Triton names would collide with another model's; a
    ModelName passed again is returned as it is, never re-checked. It *is* the string (JSON, MLflow,
    log lines and paths take it unchanged).
    """

    __slots__ = ()

    def __new__(cls, value: object) -> ModelName:
        if isinstance(value, ModelName):
            return value
        _check(value)
        return super().__new__(cls, value)

    def __reduce__(self) -> tuple[type[ModelName], tuple[str]]:
        return (ModelName, (str(self),))

    @property
    def names(self) -> ServingNames:
        """The Triton names of this model's ensemble (the classic ones for the default model)."""
        return CLASSIC if self.is_default else _derive(self)

    @property
    def is_default(self) -> bool:
        return self == DEFAULT_MODEL_NAME


def _check(name: object) -> None:
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name) or ".." in name:
        raise InputError(
            f"model name {name!r} is not allowed: use 1-64 characters from letters, digits, "
            "'_', '.', '-', starting with a letter or digit (no '/', no '..')."
        )
    if name == DEFAULT_MODEL_NAME:
        return
    clash = [s for s in ROLE_SUFFIXES.values() if name.endswith(s)] or (["tokenizer"] if name in CLASSIC.all else [])
    if clash:
        raise InputError(
            f"model name {name!r} would collide with the Triton models seqcls derives for other models "
            f"(names ending in {', '.join(ROLE_SUFFIXES.values())} are reserved, and so are "
            f"{', '.join(CLASSIC.all)}); choose another --model-name"
        )
    for derived in _derive(name).all:
        if not _TRITON_NAME.fullmatch(derived):
            raise InputError(f"model name {name!r}: derived Triton name {derived!r} is too long (max 80)")


def _derive(name: str) -> ServingNames:
    roles = ("tokenizer", "model", "postprocess", "candidate")
    return ServingNames(name, name, *(name + ROLE_SUFFIXES[r] for r in roles))


def require_name(value: object) -> ModelName:
    """``value`` if it was checked at an edge (a :class:`ModelName`); a TypeError for anything else.

    What builds a path or a lock from a model name calls this: an unchecked string is a programming
    error there, not an input to check again.
    """
    if not isinstance(value, ModelName):
        raise TypeError(f"{value!r} is an unchecked {type(value).__name__}: make it a ModelName where it enters")
    return value


#: The default model, for code and tests that mean the classic ensemble.
DEFAULT_MODEL = ModelName(DEFAULT_MODEL_NAME)
CLASSIC = ServingNames(DEFAULT_MODEL, "seqcls", "tokenizer", "seqcls_model", "seqcls_postprocess", "seqcls_candidate")
ENSEMBLE = CLASSIC.ensemble
TOKENIZER = CLASSIC.tokenizer
MODEL = CLASSIC.model
POSTPROCESS = CLASSIC.postprocess
COMPOSING = CLASSIC.composing
MODELS = CLASSIC.models
CANDIDATE_ENSEMBLE = CLASSIC.candidate
