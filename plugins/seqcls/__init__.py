"""seqcls: release a PaddleNLP ERNIE sequence classifier to Triton, safely and repeatably.

The library is importable without Airflow (only ``seqcls.airflow`` imports it) and without the
heavy ML stacks: paddle, paddle2onnx, onnxruntime and mlflow are imported inside the functions
that need them, so ``import seqcls`` is cheap enough for DAG parsing.
"""

from __future__ import annotations

from seqcls.errors import (
    CheckpointError,
    ConversionError,
    GateError,
    InputError,
    RegistryError,
    SeqclsError,
    ServingError,
    SmokeError,
    StepOrderError,
)

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConversionError",
    "GateError",
    "InputError",
    "RegistryError",
    "SeqclsError",
    "ServingError",
    "SmokeError",
    "StepOrderError",
    "__version__",
]
