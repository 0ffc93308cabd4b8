"""Release parameters: one validated dataclass shared by the CLI, the library and the DAG params.

Validation lives in ``__post_init__`` so a bad value fails before any work, with a message that
names the parameter (the same names the CLI flags and the Airflow Params form use).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from seqcls.errors import InputError
from seqcls.settings import DEFAULT_MODEL_NAME, validate_model_name

PROFILES = ("fp32", "fp32-fused", "int8")
PROVIDERS = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ReleaseConfig:
    """What a release is asked to do; every field has a safe default.

    Parity defaults (``atol``/``rtol`` on logits, ``prob_atol`` on probabilities) were chosen from
    measurement: CPU Paddle vs ONNX Runtime differ by ≤ 1e-7 on typical logits and ≤ 1e-4 on
    large ones, so 1e-4 + 1e-3·|x| flags real conversion bugs (which move logits by ≥ 1e-2) while
    tolerating float reordering; a GPU provider is allowed 10× more (``gpu_tolerance_factor``).
    """

    model_name: str = DEFAULT_MODEL_NAME
    opset: int = 14
    max_length: int = 128
    threshold: float = 0.5
    thresholds: dict[str, float] = field(default_factory=dict)
    hierarchy: bool = True
    atol: float = 1e-4
    rtol: float = 1e-3
    prob_atol: float = 1e-5
    near_margin: float = 1e-3
    gpu_tolerance_factor: float = 10.0
    provider: str = "auto"
    require_gpu: bool = False
    profile: str = "fp32"
    min_decision_agreement: float = 0.995

    def __post_init__(self) -> None:
        validate_model_name(self.model_name)
        _int_in("opset", self.opset, 11, 21)
        _int_in("max_length", self.max_length, 8, 4096)
        _prob("threshold", self.threshold)
        if not isinstance(self.thresholds, dict):
            raise InputError(f"thresholds must be a mapping label -> threshold, got {self.thresholds!r}")
        for label, value in self.thresholds.items():
            _prob(f"thresholds[{label!r}]", value)
        for name in ("atol", "rtol", "prob_atol", "near_margin"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0 or value > 1:
                raise InputError(f"{name} must be a number in [0, 1], got {value!r}")
        if self.provider not in PROVIDERS:
            raise InputError(f"provider must be one of {', '.join(PROVIDERS)}, got {self.provider!r}")
        if self.profile not in PROFILES:
            raise InputError(f"profile must be one of {', '.join(PROFILES)}, got {self.profile!r}")
        if not 0 < self.min_decision_agreement <= 1:
            raise InputError(f"min_decision_agreement must be in (0, 1], got {self.min_decision_agreement!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReleaseConfig:
        """Build from params/JSON, ignoring ``None`` values; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown release parameter(s): {', '.join(unknown)}")
        return cls(**{k: v for k, v in data.items() if v is not None})


def _int_in(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


def _prob(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise InputError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
