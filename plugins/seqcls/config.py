"""Release parameters: one validated dataclass, and the one table of their ranges and enums.

:data:`FIELDS` is the only place a parameter's type, range, enum, title and description are
written. :class:`ReleaseConfig` validates against it in ``__post_init__`` (a bad value fails
before any work, naming the parameter), the CLI's flags are generated from it
(:func:`add_arguments`), and so are the Airflow Params form (:func:`param_schema`, used by
``seqcls.airflow.params``) — a test asserts the DAG's Params equal these schemas.

The form groups the fields (Airflow 3 Params ``section``): everyday ones (no section: the form's
first, open section), :data:`GATE_SECTION`, :data:`EXPERT_SECTION`. A ``number`` is entered as text
there (Airflow's number widget rounds: ``1e-8`` was sent as ``1``) and parsed exactly by
:meth:`ReleaseConfig.from_dict` (:meth:`Field.parse`); the CLI's flags stay floats.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from seqcls.contract.names import DEFAULT_MODEL, MODEL_NAME_PATTERN, ModelName
from seqcls.errors import InputError
from seqcls.fields import Field
from seqcls.settings import (
    DEVICES,
    ENV_DEVICE,
    ENV_RUNTIME,
    ENV_SERVING_LAYOUT,
    ENV_SERVING_METRICS,
    ENV_SERVING_PIPELINE,
    PIPELINES,
    RUNTIMES,
    Settings,
    parse_layout,
)
from seqcls.spec import PROFILES, PROVIDERS, ServingSpec, combination_refusal

#: The trigger form's sections after the everyday one (a field without a section is everyday).
SERVING_SECTION = "Serving: how Triton runs this model"
GATE_SECTION = "Gates: parity and quality tolerances"
EXPERT_SECTION = "Expert: export, gate provider, connections"
SECTIONS: tuple[str | None, ...] = (None, SERVING_SECTION, GATE_SECTION, EXPERT_SECTION)
#: ``INSTANCESxTHREADS`` of the ONNX model (CPU), as typed.
LAYOUT_TEXT = r"^\s*[0-9]+\s*[xX]\s*[0-9]+\s*$"
METRICS_SWITCH = ("on", "off")
#: The gates an override may name (``seqcls.release.verdicts.GATES``), as typed: comma-separated.
OVERRIDABLE = ("parity", "quality")
OVERRIDE_TEXT = r"^\s*[a-z]+(\s*,\s*[a-z]+)*\s*$"
#: A rule is loosened when it lets more through than its default: larger (tolerances, drops, the labels'
#: support floor) or smaller (agreement, the eval set's size), or unset where the default sets it.
LOOSER_WHEN_LARGER = {
    "atol": "parity",
    "rtol": "parity",
    "near_margin": "parity",
    "gpu_tolerance_factor": "parity",
    "max_f1_drop": "quality",
    "max_f1_drop_relative": "quality",
    "max_level_f1_drop": "quality",
    "max_label_f1_drop": "quality",
    "max_profile_f1_drop": "quality",
    "min_label_support": "quality",
}
LOOSER_WHEN_SMALLER = {"min_decision_agreement": "parity", "min_eval_texts": "quality"}


def _gate(name: str, title: str, description: str, *examples: str, nullable: bool = False) -> Field:
    """A gate's tolerance or rule: a number in [0, 1], in the form's gate section."""
    return Field(name, "number", title, description, 0, 1, nullable=nullable, section=GATE_SECTION, examples=examples)


def _rule(name: str, title: str, description: str, *examples: str) -> Field:
    """A quality rule: like :func:`_gate`, and unset (None) turns it off."""
    return _gate(name, title, description, *examples, nullable=True)


FIELDS: tuple[Field, ...] = (
    Field(
        "model_name",
        "string",
        "Model name",
        "MLflow registered model and release workspace name (letters, digits, _ . -).",
        pattern=MODEL_NAME_PATTERN,
    ),
    Field("opset", "integer", "ONNX opset", "ONNX opset of the converted model.", 11, 21, section=EXPERT_SECTION),
    Field(
        "max_length",
        "integer",
        "Max length",
        "Tokenizer max_length (tokens per text).",
        8,
        4096,
        section=EXPERT_SECTION,
    ),
    Field(
        "threshold",
        "number",
        "Threshold",
        "Decision threshold on sigmoid probabilities.",
        0,
        1,
        exclusive=True,
        examples=("0.5", "0.4", "0.6"),
    ),
    Field(
        "thresholds",
        "object",
        "Per-label thresholds",
        'JSON object label → threshold, e.g. {"体育##夺冠": 0.6}; other labels use Threshold.',
    ),
    Field(
        "hierarchy",
        "boolean",
        "Hierarchical labels",
        "A predicted child label (parent##child) implies its parent.",
        section=EXPERT_SECTION,
    ),
    _gate("atol", "Parity atol", "Logits absolute tolerance of the parity gate.", "1e-4", "1e-5", "1e-6", "1e-3"),
    _gate("rtol", "Parity rtol", "Logits relative tolerance of the parity gate.", "1e-3", "1e-4", "1e-5", "1e-2"),
    _rule(
        "prob_atol",
        "Parity prob_atol",
        "Optional stricter tolerance on probabilities; unset = derived from the logit tolerance "
        "((atol + rtol·|x|)/4, sigmoid's largest slope).",
        "1e-4",
        "1e-5",
        "1e-6",
    ),
    _gate(
        "near_margin",
        "Near-threshold margin",
        "Probabilities this close to a threshold may flip.",
        "1e-3",
        "1e-4",
        "1e-2",
    ),
    Field(
        "gpu_tolerance_factor",
        "number",
        "GPU tolerance factor",
        "Tolerances are multiplied by this when the gate runs on CUDA.",
        1,
        1000,
        section=GATE_SECTION,
        examples=("10", "1", "100"),
    ),
    Field(
        "provider",
        "string",
        "ONNX Runtime provider",
        "Provider the parity gate runs ONNX on.",
        enum=PROVIDERS,
        section=EXPERT_SECTION,
    ),
    Field(
        "require_gpu",
        "boolean",
        "Require GPU",
        "Fail the parity gate when CUDA is not available.",
        section=EXPERT_SECTION,
    ),
    Field(
        "profile",
        "string",
        "Serving profile",
        "fp32, fp32-fused (ORT-fused graph), int8 (dynamic quantisation) or bf16 (OpenVINO, CPUs with AVX512-BF16 "
        "or AMX), each gated; auto: convert times each on this host and serves the fastest that keeps "
        "min_decision_agreement and max_profile_f1_drop vs fp32.",
        enum=PROFILES,
    ),
    Field(
        "runtime",
        "string",
        "Triton runtime",
        f"Triton's backend for the ONNX model: python-onnxruntime (python backend, local Triton) or onnxruntime "
        f"(native backend, NGC image). Unset = {ENV_RUNTIME}, else python-onnxruntime.",
        enum=RUNTIMES,
        nullable=True,
        section=SERVING_SECTION,
    ),
    Field(
        "pipeline",
        "string",
        "Serving pipeline",
        "ensemble: the public model is Triton's ensemble of tokenizer → model → postprocess; direct: one python "
        f"model running the same three steps (python runtime only). Unset = {ENV_SERVING_PIPELINE}, else ensemble.",
        enum=PIPELINES,
        nullable=True,
        section=SERVING_SECTION,
    ),
    Field(
        "device",
        "string",
        "Serving device",
        f"cpu, or gpu (GPU instance group, length buckets, the native backend). Unset = {ENV_DEVICE}, else cpu.",
        enum=DEVICES,
        nullable=True,
        section=SERVING_SECTION,
    ),
    Field(
        "layout",
        "string",
        "CPU layout",
        "The ONNX model's INSTANCESxTHREADS on CPU, e.g. 2x1 (`seqcls calibrate-layout` measures which is fastest). "
        f"Unset = {ENV_SERVING_LAYOUT}, else 1x2.",
        pattern=LAYOUT_TEXT,
        nullable=True,
        section=SERVING_SECTION,
    ),
    Field(
        "expected_clients",
        "integer",
        "Expected clients",
        "Concurrent single-text clients the model is expected to serve: profile auto times every candidate at "
        "this concurrency (as well as one text at a time) and serves the fastest at it.",
        1,
        256,
        section=EXPERT_SECTION,
    ),
    Field(
        "serving_metrics",
        "string",
        "Serving metrics",
        f"on: the python models export seqcls_* metrics; off: none (to measure their cost). Unset = "
        f"{ENV_SERVING_METRICS}, else on.",
        enum=METRICS_SWITCH,
        nullable=True,
        section=SERVING_SECTION,
    ),
    _gate(
        "min_decision_agreement",
        "Min decision agreement",
        "Share of label decisions a non-exact profile (int8, bf16) must keep.",
        "0.995",
        "0.999",
        "0.99",
    ),
    Field(
        "eval_set",
        "string",
        "Eval set",
        "Labeled texts the quality gate scores candidate and champion on: PaddleNLP's text<TAB>label,label "
        'or JSONL {"text", "labels"}. In a DAG run: a path under the model\'s checkpoints root. '
        "Unset = the checkpoint's own test/dev file, if it has one.",
        nullable=True,
    ),
    _rule("min_micro_f1", "Min micro-F1", "Quality floor: refuse a candidate below this micro-F1.", "0.9", "0.8"),
    _rule("min_macro_f1", "Min macro-F1", "Quality floor: refuse a candidate below this macro-F1.", "0.8", "0.7"),
    _rule(
        "max_f1_drop",
        "Max F1 drop",
        "Largest absolute drop vs the served champion of micro-F1, macro-F1 and sample accuracy (same eval set).",
        "0.025",
        "0.01",
        "0.05",
    ),
    _rule(
        "max_f1_drop_relative",
        "Max relative F1 drop",
        "Largest relative drop (0.05 = 5 %) vs the champion of micro-F1, macro-F1 and sample accuracy.",
        "0.05",
        "0.02",
        "0.1",
    ),
    _rule(
        "max_level_f1_drop",
        "Max per-level F1 drop",
        "Largest absolute drop vs the champion of each hierarchy level's micro- and macro-F1.",
        "0.03",
        "0.02",
        "0.05",
    ),
    _rule(
        "max_label_f1_drop",
        "Max per-label F1 drop",
        "Largest absolute drop vs the champion of one label's F1 (labels with Min label support).",
        "0.15",
        "0.1",
        "0.3",
    ),
    Field(
        "min_eval_texts",
        "integer",
        "Min eval texts",
        "The fewest labeled texts the quality gate takes a verdict on: a smaller eval set is refused at resolve.",
        1,
        1_000_000,
        section=GATE_SECTION,
    ),
    Field(
        "min_label_support",
        "integer",
        "Min label support",
        "Gold texts a label needs in the eval set before its own F1 is gated.",
        1,
        1_000_000,
        section=GATE_SECTION,
    ),
    _rule(
        "max_profile_f1_drop",
        "Max profile F1 drop",
        "fp32-fused / int8: largest drop of micro- and macro-F1 vs the fp32 graph on the same eval set.",
        "0.005",
        "0.002",
        "0.01",
    ),
    Field(
        "override",
        "string",
        "Override gates",
        "Gates whose refusal this release overrides (parity, quality; comma-separated). The gate still judges; "
        "its refusal is recorded as overridden — history, MLflow, status, the notification — with the reason. "
        "Also needed to loosen a gate's rule beyond its default.",
        pattern=OVERRIDE_TEXT,
        nullable=True,
        section=GATE_SECTION,
    ),
    Field(
        "override_reason",
        "string",
        "Override reason",
        "Why the gates in Override gates are overridden (required with them; recorded wherever the override is).",
        nullable=True,
        section=GATE_SECTION,
    ),
    Field(
        "allow_unsafe_pickle",
        "boolean",
        "Allow unsafe pickle",
        "Load a .pdparams whose pickle imports more than arrays, unscanned (trusted legacy files only); "
        "also needs SEQCLS_ALLOW_UNSAFE_PICKLE=1 on the worker. Prefer model.safetensors.",
        section=EXPERT_SECTION,
    ),
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}


@dataclass(frozen=True)
class ReleaseConfig:
    """What a release is asked to do; every field has a safe default.

    Parity defaults (``atol``/``rtol`` on logits) were chosen from measurement: CPU Paddle vs
    ONNX Runtime differ by ≤ 1e-7 on typical logits and ≤ 1e-4 on large ones, so 1e-4 + 1e-3·|x|
    flags real conversion bugs (which move logits by ≥ 1e-2) while tolerating float reordering;
    probabilities follow from it (see :mod:`seqcls.gates.parity`); a GPU provider is allowed 10× more.
    """

    model_name: ModelName = DEFAULT_MODEL
    opset: int = 14
    max_length: int = 128
    threshold: float = 0.5
    thresholds: dict[str, float] = field(default_factory=dict)
    hierarchy: bool = True
    atol: float = 1e-4
    rtol: float = 1e-3
    prob_atol: float | None = None
    near_margin: float = 1e-3
    gpu_tolerance_factor: float = 10.0
    provider: str = "auto"
    require_gpu: bool = False
    profile: str = "fp32"
    #: The serving spec's other fields; None: the environment's default (:func:`serving_spec`).
    runtime: str | None = None
    pipeline: str | None = None
    device: str | None = None
    layout: str | None = None
    #: profile auto's timing concurrency (:mod:`seqcls.profiles.timing`): how the choice is measured
    expected_clients: int = 8
    serving_metrics: str | None = None
    min_decision_agreement: float = 0.995
    eval_set: str | None = None
    min_micro_f1: float | None = None
    min_macro_f1: float | None = None
    max_f1_drop: float | None = 0.025
    max_f1_drop_relative: float | None = None
    max_level_f1_drop: float | None = 0.03
    max_label_f1_drop: float | None = 0.15
    min_eval_texts: int = 50
    min_label_support: int = 20
    max_profile_f1_drop: float | None = 0.005
    override: str | None = None
    override_reason: str | None = None
    allow_unsafe_pickle: bool = False

    def __post_init__(self) -> None:
        # the edge where a release's model name enters: checked once into the value inner floors take
        object.__setattr__(self, "model_name", ModelName(self.model_name))
        for spec in FIELDS:
            spec.check(getattr(self, spec.name))
        if self.min_decision_agreement <= 0:
            raise InputError(f"min_decision_agreement must be in (0, 1], got {self.min_decision_agreement!r}")
        if self.layout is not None:
            parse_layout(self.layout, source="layout")
        self._check_overrides()
        runtime = self.runtime or ("onnxruntime" if self.device == "gpu" else "python-onnxruntime")
        refusal = combination_refusal(runtime, self.device or "cpu", self.pipeline or "ensemble")
        if refusal:  # explicit values that cannot go together: refused with the params, not at publish
            raise InputError(refusal)

    @property
    def overrides(self) -> tuple[str, ...]:
        """The gates this release overrides (``override``, split and checked)."""
        return tuple(dict.fromkeys(g.strip() for g in (self.override or "").split(",") if g.strip()))

    def loosened(self) -> dict[str, str]:
        """Rule → gate, for each rule set looser than its default (an override of that gate)."""
        out = {}
        defaults = {f.name: f.default for f in fields(self)}
        for name, gate in (*LOOSER_WHEN_LARGER.items(), *LOOSER_WHEN_SMALLER.items()):
            value, default = getattr(self, name), defaults[name]
            if default is None:
                continue
            larger = name in LOOSER_WHEN_LARGER
            if value is None or (value > default if larger else value < default):
                out[name] = gate
        return out

    def _check_overrides(self) -> None:
        def defaults_of(name: str) -> Any:
            return next(f.default for f in fields(self) if f.name == name)

        for gate in self.overrides:
            if gate not in OVERRIDABLE:
                raise InputError(f"override: {gate!r} is not a gate; the gates are {', '.join(OVERRIDABLE)}")
        reason = (self.override_reason or "").strip()
        if self.overrides and not reason:
            raise InputError(
                f"override {', '.join(self.overrides)} needs override_reason (--reason / the override_reason param): "
                "an override is recorded with why it was given"
            )
        if reason and not self.overrides:
            raise InputError("override_reason is given without an override (--override GATE / the override param)")
        for name, gate in self.loosened().items():
            if gate not in self.overrides:
                value = getattr(self, name)
                raise InputError(
                    f"{name} {'unset' if value is None else value} loosens the {gate} gate (default "
                    f'{defaults_of(name)}): that is an override — give --override {gate} --reason "…" (the '
                    "override and override_reason params), or keep the rule at its default or stricter"
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReleaseConfig:
        """Build from params/JSON, ignoring ``None`` values; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown release parameter(s): {', '.join(unknown)}")
        return cls(**{k: _parse(k, v) for k, v in data.items() if v is not None})


DEFAULTS = ReleaseConfig()


def _parse(name: str, value: Any) -> Any:
    spec = FIELD_BY_NAME.get(name)
    return spec.parse(value) if spec else value


def param_schema(name: str) -> dict[str, Any]:
    """Keyword arguments for an Airflow ``Param`` of release parameter ``name`` (default included)."""
    spec = FIELD_BY_NAME[name]
    section = {"section": spec.section} if spec.section else {}
    return {
        "default": getattr(DEFAULTS, name),
        "title": spec.title,
        "description": spec.description,
        **spec.schema(),
        **section,
    }


def _json_object(value: str) -> dict[str, Any]:
    try:
        data = json.loads(value) if value.strip() else {}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError("expected a JSON object label -> threshold")
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One CLI flag per release parameter, with the table's type, choices and help."""
    kinds = {"integer": int, "number": float, "string": str, "object": _json_object}
    for spec in FIELDS:
        default = getattr(DEFAULTS, spec.name)
        help_text = f"{spec.description} (default: {json.dumps(default, ensure_ascii=False)})"
        if spec.type == "boolean":
            parser.add_argument(spec.flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(
                spec.flag, type=kinds[spec.type], choices=spec.enum, default=None, help=help_text.replace("%", "%%")
            )


def config_from_args(args: argparse.Namespace) -> ReleaseConfig:
    """The release config from parsed flags (unset flags keep the defaults)."""
    return ReleaseConfig.from_dict({spec.name: getattr(args, spec.name, None) for spec in FIELDS})


#: The release parameters that make up the serving spec besides ``profile`` (their env names supply defaults).
SPEC_PARAMS = ("runtime", "pipeline", "device", "layout", "serving_metrics")


def serving_spec(config: ReleaseConfig, settings: Settings, recorded: dict[str, Any] | None = None) -> ServingSpec:
    """The release's serving spec (:meth:`ServingSpec.resolve`): its explicit params over ``recorded`` (what the
    run's resolve recorded) over the environment's defaults as ``settings`` read them."""
    explicit = {
        "runtime": config.runtime,
        "pipeline": config.pipeline,
        "device": config.device,
        "layout": config.layout,
        "metrics": None if config.serving_metrics is None else config.serving_metrics == "on",
    }
    return ServingSpec.resolve(config.profile, explicit, settings, recorded)
