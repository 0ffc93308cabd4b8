"""A stand-in for ``triton_python_backend_utils``: just what the seqcls python models call.

The one fake, shared by the tests (which drive each shipped ``model.py``'s ``execute`` without a
Triton) and the in-process bench (:mod:`seqcls_tools.bench.per_text`): install it with
``sys.modules["triton_python_backend_utils"] = fake_pb_utils()`` before loading a ``model.py``.
A request is a ``{input name: Tensor}`` dict (:func:`request`), read by ``get_input_tensor_by_name``.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import ClassVar

import numpy as np


class TritonError:
    INVALID_ARG = "INVALID_ARG"

    def __init__(self, message: str, code: object = None) -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> object:
        return self._code


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        assert isinstance(array, np.ndarray), f"{name}: {type(array)}"
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors or []}
        self.error = error


class Logger:
    """Keeps every error the models log (tests assert on :attr:`errors`) and echoes it to stderr."""

    errors: ClassVar[list[str]] = []

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.errors.append(message)
        print(message, file=sys.stderr)


class MetricFamily:
    """Triton's custom-metrics API as the models use it; every series lands in :attr:`series`
    (``(family name, sorted label items) -> value``, or the list of observations for a histogram)."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    series: ClassVar[dict[tuple[str, tuple[tuple[str, str], ...]], object]] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        assert kind in (self.COUNTER, self.GAUGE, self.HISTOGRAM), kind
        self.name, self.description, self.kind = name, description, kind
        self.series = type(self).series  # this fake module's (see fake_pb_utils)

    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> _Metric:  # Triton's name
        assert (buckets is not None) == (self.kind == self.HISTOGRAM), "buckets exactly for histograms"
        key = (self.name, tuple(sorted(labels.items())))
        self.series.setdefault(key, [] if self.kind == self.HISTOGRAM else 0.0)
        return _Metric(key, self.series)


class _Metric:
    """Bound to the series of the fake it was made by: a model of an earlier test, whose flusher
    thread still runs, never counts into a later test's series."""

    def __init__(self, key: tuple, series: dict) -> None:
        self.key, self.series = key, series

    def increment(self, value: float) -> None:
        self.series[self.key] += value

    def observe(self, value: float) -> None:
        self.series[self.key].append(value)


def fake_pb_utils() -> ModuleType:
    """A fresh ``triton_python_backend_utils`` module made of the classes above."""
    mod = ModuleType("triton_python_backend_utils")
    mod.TritonError = TritonError  # type: ignore[attr-defined]
    mod.Tensor = Tensor  # type: ignore[attr-defined]
    mod.InferenceResponse = InferenceResponse  # type: ignore[attr-defined]
    mod.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    mod.Logger = Logger  # type: ignore[attr-defined]
    # each fake module counts into its own dict (the newest is MetricFamily.series, what tests read):
    # a model of an earlier test, whose flusher thread still runs, never counts into a later test's
    MetricFamily.series = {}
    mod.MetricFamily = type("MetricFamily", (MetricFamily,), {"series": MetricFamily.series})  # type: ignore[attr-defined]
    mod.get_input_tensor_by_name = lambda request, name: request.get(name)  # type: ignore[attr-defined]
    return mod


def request(**arrays: np.ndarray) -> dict[str, Tensor]:
    """A request as the fake ``get_input_tensor_by_name`` reads it."""
    return {name: Tensor(name, np.asarray(a)) for name, a in arrays.items()}
