"""The demo model trained once per test session and shared by the modules that need a trained classifier.

Training is the slowest thing a test can ask for (the quick demo model: 4 epochs, ~35 s on two idle
cores), so the first module that asks trains it under the session's base temporary directory and
every later one gets the same directory and the same :class:`~seqcls_tools.demo.train.TrainResult`.
Callers only read it: a module that needs a changed copy copies it first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

_TRAINED: dict[tuple[int, int | None], Any] = {}


def quick_demo_model(factory: pytest.TempPathFactory, *, seed: int = 0, epochs: int | None = None):
    """The quick demo model of ``seed`` (``epochs`` overrides its 4), trained epoch-bound, once per session."""
    from seqcls_tools.demo.train import train_demo_checkpoint

    key = (seed, epochs)
    if key not in _TRAINED:
        out = Path(factory.getbasetemp()) / f"demo-quick-s{seed}-e{epochs or 'default'}"
        _TRAINED[key] = train_demo_checkpoint(out, seed=seed, quick=True, epochs=epochs, max_seconds=600)
    return _TRAINED[key]
