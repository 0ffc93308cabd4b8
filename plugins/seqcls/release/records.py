"""The release workspace's layout and the typed records that cross step boundaries.

A step writes its files under its own directory and a summary into the manifest; a later step
that needs them reads them through this module — never by path literal or dict key of its own —
so each file has one owner and each record one definition (with its JSON form). The workspace
*mechanics* (staging, atomic rename, skip/redo) are :mod:`seqcls.release.workspace`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from seqcls.contract import shipped
from seqcls.errors import StepOrderError
from seqcls.frameworks import ServingTokenizer, for_checkpoint
from seqcls.release.workspace import Release, Workspace
from seqcls.spec import AUTO_PROFILE

# --- layout: the directory each step owns, and the files other steps read ---------------------
OUT_DIRS: dict[str, str] = {
    "export": "static",
    "convert": "onnx",
    "validate": "parity",
    "evaluate": "quality",
    "register": "registry",
    "publish": "publish",
    "reload": "reload",
    "smoke": "smoke",
    "expose": "expose",
    "promote": "promote",
    "rollback": "rollback",
}
STATIC_DIR = OUT_DIRS["export"]
MODEL_ONNX = f"{OUT_DIRS['convert']}/model.onnx"
SERVED_ONNX = f"{OUT_DIRS['convert']}/served.onnx"  # a profile's optimised graph (fp32-fused, int8)
PARITY_REPORT = f"{OUT_DIRS['validate']}/report.json"
PARITY_EXPECTED = f"{OUT_DIRS['validate']}/expected.json"
PARITY_PLOT = f"{OUT_DIRS['validate']}/plot.png"
EVALUATION = f"{OUT_DIRS['evaluate']}/evaluation.json"
BAD_CASES = f"{OUT_DIRS['evaluate']}/bad_cases.tsv"
SHADOW = f"{OUT_DIRS['evaluate']}/shadow.json"
QUALITY_PLOT = f"{OUT_DIRS['evaluate']}/labels.png"
REFERENCE = f"{OUT_DIRS['evaluate']}/reference.json"

R = TypeVar("R")


def _from(cls: type[R], data: dict[str, Any]) -> R:
    """Build a record from JSON, ignoring keys a newer writer added."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


def static_dir(ws: Workspace) -> Path:
    return ws.path(STATIC_DIR)


def served_onnx(ws: Workspace) -> Path:
    """The ONNX file serving runs, as convert recorded it (``served_file`` only for optimised profiles)."""
    summary = ws.require("convert")["summary"]
    return ws.path(summary.get("served_file") or summary.get("model_file") or MODEL_ONNX)


def serving_tokenizer(release: Release) -> ServingTokenizer:
    """The tokenizer Triton's ``tokenizer`` model runs for this release (the framework adapter knows which file)."""
    return for_checkpoint(release.checkpoint).serving_tokenizer(release.checkpoint, release.workspace)


def model_inputs(ws: Workspace) -> list[str]:
    """The id tensors the served graph takes (convert recorded them; older records: the Paddle pair)."""
    summary = ws.require("convert")["summary"]
    return list(summary.get("inputs") or shipped.contract().MODEL_INPUTS)


def effective_profile(release: Release) -> str:
    """The profile served and gated: the configured one, or for ``profile: auto`` the one convert chose
    (its record's ``profile_choice``). The configured value (``auto``) stays the release's identity
    (release key, workspace inputs); everything that means "what is served" asks here."""
    configured = release.config.profile
    if configured != AUTO_PROFILE:
        return configured
    summary = release.workspace.require("convert", hint="`seqcls convert` (profile auto chooses there)")["summary"]
    chosen = (summary.get("profile_choice") or {}).get("chosen")
    if not chosen:
        raise StepOrderError(
            f"{release.workspace.root}: the convert record names no chosen profile for profile auto; "
            "re-run `seqcls convert` (or the release) to choose one."
        )
    return str(chosen)


def profile_words(release: Release) -> str:
    """The effective profile as a message names it: ``int8``, or ``int8 (chosen by profile auto)``."""
    profile, configured = effective_profile(release), release.config.profile
    return profile if profile == configured else f"{profile} (chosen by profile {configured})"


def fp32_onnx(ws: Workspace) -> Path:
    return ws.path(ws.require("convert")["summary"].get("model_file") or MODEL_ONNX)


# --- validate → publish, smoke: the answers the served ensemble must give ----------------------
@dataclass
class ExpectedItem:
    text: str
    labels: list[str]
    confidences: list[float]
    probabilities: list[float]
    near_threshold: bool


@dataclass
class Expected:
    """What the parity gate validated, per golden text, as served (each text alone)."""

    labels: list[str]
    thresholds: list[float]
    hierarchy: bool
    max_length: int
    prob_atol: float
    gate: str  # "exact" | "agreement"
    min_agreement: float
    items: list[ExpectedItem] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Expected:
        out = _from(cls, data)
        out.items = [i if isinstance(i, ExpectedItem) else _from(ExpectedItem, i) for i in out.items]
        return out

    def save(self, directory: Path) -> Path:
        path = directory / Path(PARITY_EXPECTED).name
        path.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
        return path

    @classmethod
    def load(cls, ws: Workspace) -> Expected:
        ws.require("validate")
        return cls.from_dict(json.loads(ws.path(PARITY_EXPECTED).read_text(encoding="utf-8")))


# --- validate → register: the gate's report -----------------------------------------------------
#: Report figures not logged as MLflow metrics: the tolerances and the gating mode (the run's params ``atol``,
#: ``rtol``, ``rule.gpu_tolerance_factor``, ``profile_chosen`` give them; the report keeps them) and the sections'
#: text counts (the metric ``texts``).
NOT_METRICS = frozenset({"numeric.atol", "numeric.rtol", "numeric.gating", "decisions.texts", "tokenizer.texts"})


@dataclass
class ParityReport:
    """The parity gate's findings (``parity/report.json``); sections are the checks' own dicts."""

    model_name: str
    fingerprint: str
    golden_source: str
    texts: int
    profile: str
    tokenizer: dict[str, Any] = field(default_factory=dict)
    numeric: dict[str, Any] = field(default_factory=dict)
    decisions: dict[str, Any] = field(default_factory=dict)
    #: an engine that may share runs between texts (bf16): alone vs random compositions, and how it serves
    batch_invariance: dict[str, Any] = field(default_factory=dict)
    provider: str | None = None
    thresholds: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    passed: bool = False
    gate_errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, directory: Path) -> Path:
        path = directory / Path(PARITY_REPORT).name
        path.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
        return path

    @classmethod
    def load(cls, ws: Workspace) -> ParityReport:
        ws.require("validate")
        return _from(cls, json.loads(ws.path(PARITY_REPORT).read_text(encoding="utf-8")))

    def metrics(self) -> dict[str, float]:
        """Every measured figure as ``section.key`` (bools included: passed → 1.0), for MLflow — not the ones
        that restate a param or ``texts`` (:data:`NOT_METRICS`): a run's metric is three rows of MLflow's
        database kept for ever, once a day on a schedule."""
        out: dict[str, float] = {}
        for section in ("numeric", "decisions", "tokenizer"):
            for key, value in getattr(self, section).items():
                if isinstance(value, int | float) and f"{section}.{key}" not in NOT_METRICS:
                    out[f"{section}.{key}"] = float(value)
        out["texts"] = float(self.texts)
        return out


# --- evaluate → smoke: eval texts for the shadow comparison on the live server ---------------------
@dataclass
class Shadow:
    """A sample of the eval set with the answers the quality gate scored offline (candidate, champion)."""

    texts: list[str]
    candidate: list[list[str]]
    champion: list[list[str]] | None = None
    champion_version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, directory: Path) -> Path:
        path = directory / Path(SHADOW).name
        path.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
        return path

    @classmethod
    def find(cls, ws: Workspace) -> Shadow | None:
        """The sample, if evaluate passed with an eval set and its file is the one it recorded (else None)."""
        rec = ws.step("evaluate")
        if not rec or rec.get("status") != "ok" or SHADOW not in rec.get("outputs", {}):
            return None
        data = ws.path(SHADOW).read_bytes()
        if hashlib.sha256(data).hexdigest() != rec["outputs"][SHADOW]:
            return None
        return _from(cls, json.loads(data))


# --- publish → reload, smoke, promote, rollback -------------------------------------------------
@dataclass
class Published:
    """The Triton version a release was published as."""

    version: int
    reused: bool = False
    repository: str = ""
    publish_key: str = ""
    serving: dict[str, Any] = field(default_factory=dict)
    pruned: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def load(cls, ws: Workspace) -> Published:
        return _from(cls, ws.require("publish")["summary"])


# --- register → promote, rollback ----------------------------------------------------------------
@dataclass
class Registered:
    """The MLflow model version a release registered (or found already registered).

    ``release_key``: the serving configuration the version stands for (``seqcls.release.keys.release_key``;
    None in records written before release keys).
    """

    model_name: str
    version: int
    run_id: str | None = None
    created: bool = False
    created_registered_model: bool = False
    previous_candidate: int | None = None
    model_uri: str | None = None
    logged_model: str | None = None
    seconds: float | None = None
    undone: bool = False
    undo_actions: list[str] = field(default_factory=list)
    release_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def load(cls, ws: Workspace) -> Registered:
        return _from(cls, ws.require("register", hint="`seqcls register`")["summary"])

    @classmethod
    def find(cls, ws: Workspace) -> Registered | None:
        """The record if register succeeded, else None (rollback asks without requiring it)."""
        rec = ws.step("register")
        return _from(cls, rec["summary"]) if rec and rec.get("status") == "ok" else None


def published_version(release: Release) -> int:
    return Published.load(release.workspace).version


__all__ = [
    "BAD_CASES",
    "EVALUATION",
    "MODEL_ONNX",
    "OUT_DIRS",
    "PARITY_EXPECTED",
    "PARITY_PLOT",
    "PARITY_REPORT",
    "QUALITY_PLOT",
    "SERVED_ONNX",
    "SHADOW",
    "STATIC_DIR",
    "Expected",
    "ExpectedItem",
    "ParityReport",
    "Published",
    "Registered",
    "Shadow",
    "effective_profile",
    "fp32_onnx",
    "profile_words",
    "published_version",
    "served_onnx",
    "static_dir",
]
