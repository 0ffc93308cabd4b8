"""The serving spec: how a release is served — its profile, and where and how Triton runs it — and what a
host can build and serve.

One record per release (:class:`ServingSpec`: profile, runtime, pipeline, device, layout, metrics), resolved
once when the release is opened (its params over the environment's defaults), recorded in its workspace and in
every published version's ``release.json``, shown by ``seqcls status``. The profiles' constants and the host
refusals (:func:`host_refusal`, :func:`combination_refusal`) live here because both the release parameters
(:mod:`seqcls.config`) and the serving floors check against them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import seqcls_engine

from seqcls.errors import InputError
from seqcls.settings import DEVICES, PIPELINES, RUNTIMES, Settings, parse_layout

#: The serving profiles, each one graph (what is served and gated); ``fp16`` is for GPUs (the CUDA provider),
#: ``bf16`` for CPUs with bf16 arithmetic (``fp32``'s graph run by OpenVINO at bf16: ``seqcls_engine``).
SERVED_PROFILES = ("fp32", "fp32-fused", "int8", "bf16", "fp16")
#: Profiles gated on numbers (exact parity) and answering a text the same in any batch; the others (int8)
#: are gated on decision agreement and served one text at a time.
EXACT_PROFILES = ("fp32", "fp32-fused")
#: Profiles that run only on this ONNX Runtime provider (built, checked and served there).
NEEDS_PROVIDER = {"fp16": "CUDAExecutionProvider"}
#: Profiles run by another engine than ONNX Runtime (engine, precision), on a CPU with one of these flags.
ENGINES = seqcls_engine.ENGINES
NEEDS_CPU = {
    profile: seqcls_engine.BF16_CPU_FLAGS for profile, (_, precision) in ENGINES.items() if precision == "bf16"
}
#: ``profile: auto``: convert measures every served profile on this host and serves the fastest that passes
#: (:mod:`seqcls.profiles.auto`); ``seqcls.release.records.effective_profile`` names the one chosen.
AUTO_PROFILE = "auto"
PROFILES = (*SERVED_PROFILES, AUTO_PROFILE)
PROVIDERS = ("auto", "cpu", "cuda")


def combination_refusal(runtime: str, device: str, pipeline: str) -> str | None:
    """Why these serving settings cannot go together (None when they can): checked wherever a spec is made."""
    if device == "gpu" and runtime != "onnxruntime":
        return "serving on a GPU needs runtime 'onnxruntime' (Triton's native backend)"
    if pipeline == "direct" and runtime != "python-onnxruntime":
        return (
            f"serving pipeline 'direct' runs the ONNX model in its python step, so it needs runtime "
            f"'python-onnxruntime', not {runtime!r}; serve Triton's native backend with pipeline 'ensemble'"
        )
    return None


def host_refusal(
    profile: str,
    *,
    providers: Sequence[str] | None = None,
    device: str | None = None,
    runtime: str | None = None,
    cpu_flags: frozenset[str] | None = None,
) -> str | None:
    """Why this host cannot build (``providers``: the ORT providers convert runs on; ``cpu_flags``: this CPU's,
    read when None) or serve (``device``: what serving configs render for; ``runtime``: Triton's backend for
    ``seqcls_model``) ``profile``; None when it can, or when the profile needs nothing."""
    if profile in ENGINES:
        return _engine_refusal(profile, providers=providers, runtime=runtime, cpu_flags=cpu_flags)
    needed = NEEDS_PROVIDER.get(profile)
    if not needed:
        return None
    if providers is not None and needed not in providers:
        return (
            f"profile {profile!r} runs on ONNX Runtime's {needed} only, and this host's convert runs on "
            f"{', '.join(providers)}: convert on the GPU host (onnxruntime-gpu, requirements-gpu.txt; provider "
            "'auto' or 'cuda'), or choose fp32-fused or int8 for CPU serving"
        )
    if device is not None and device != "gpu":
        return (
            f"profile {profile!r} is served by the native ONNX Runtime backend on a GPU, and this host renders "
            f"serving configs for device {device!r}: release with device gpu (--device gpu, the device param, or "
            "SEQCLS_DEVICE=gpu as the default: docker-compose's Airflow services set it), or choose fp32-fused or "
            "int8 for CPU serving"
        )
    return None


def _engine_refusal(
    profile: str, *, providers: Sequence[str] | None, runtime: str | None, cpu_flags: frozenset[str] | None
) -> str | None:
    """``bf16``: OpenVINO in the python backend, on a CPU that multiplies bf16 (else OpenVINO would quietly
    compute f32, and the gates would judge a graph that is not the one served elsewhere)."""
    engine, precision = ENGINES[profile]
    if runtime is not None and runtime != "python-onnxruntime":
        return (
            f"profile {profile!r} is served by {engine} at {precision} inside Triton's python backend, and this "
            f"host serves seqcls_model with the {runtime!r} runtime (Triton's native ONNX Runtime backend has no "
            f"{precision} path): release with runtime python-onnxruntime (--runtime, the runtime param, or "
            "SEQCLS_RUNTIME as the default), or choose int8 or fp32-fused"
        )
    if providers is None:
        return None
    flags = seqcls_engine.cpu_flags() if cpu_flags is None else cpu_flags
    wanted = NEEDS_CPU.get(profile, ())
    if wanted and not set(wanted) & set(flags):
        return (
            f"profile {profile!r} needs a CPU with {' or '.join(wanted)} ({precision} matrix arithmetic), and this "
            f"host's CPU flags have neither: choose int8 or fp32-fused, or convert and serve on such a CPU"
        )
    try:
        import openvino  # noqa: F401
    except ImportError as exc:
        return (
            f"profile {profile!r} runs on {engine}, which is not importable here ({exc}): install it "
            "(requirements.txt pins openvino), or choose int8 or fp32-fused"
        )
    return None


@dataclass(frozen=True)
class ServingSpec:
    """How one release is served, as one record: resolved once when the release is opened, recorded in its
    workspace and in every published version's ``release.json``, shown by ``seqcls status``.

    Why one record: a worker's environment must not change what a run publishes. Explicit values (CLI flag,
    DAG param, models file) win; the environment (``SEQCLS_RUNTIME``, ``SEQCLS_DEVICE``,
    ``SEQCLS_SERVING_*``) only supplies defaults, read where the release starts (:func:`serving_spec`).
    """

    profile: str = "fp32"
    runtime: str = RUNTIMES[0]
    pipeline: str = PIPELINES[0]
    device: str = DEVICES[0]
    layout: str | None = None  # INSTANCESxTHREADS on CPU; None: the default 1x2
    metrics: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (("runtime", RUNTIMES), ("pipeline", PIPELINES), ("device", DEVICES)):
            if getattr(self, name) not in allowed:
                raise InputError(f"serving {name} {getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.layout is not None:
            instances, threads = parse_layout(self.layout, source="layout")
            object.__setattr__(self, "layout", f"{instances}x{threads}")
        refusal = combination_refusal(self.runtime, self.device, self.pipeline)
        if refusal:
            raise InputError(refusal)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServingSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def describe(self) -> str:
        """``fp32 · python-onnxruntime · ensemble · cpu 1x2 · metrics on`` (what ``seqcls status`` shows)."""
        layout = f" {self.layout or '1x2'}" if self.device == "cpu" else ""
        metrics = "on" if self.metrics else "off"
        return f"{self.profile} · {self.runtime} · {self.pipeline} · {self.device}{layout} · metrics {metrics}"

    @classmethod
    def resolve(
        cls,
        profile: str,
        explicit: Mapping[str, Any],
        settings: Settings,
        recorded: Mapping[str, Any] | None = None,
    ) -> ServingSpec:
        """Each field from ``explicit`` when set (not None), else from ``recorded`` (the spec the run's resolve
        recorded: a later task on another worker publishes what resolve decided), else the environment's default
        as ``settings`` read it. InputError for settings that cannot go together."""
        defaults = {
            "runtime": settings.runtime,
            "pipeline": settings.serving_pipeline,
            "device": settings.device,
            "layout": settings.serving_layout,
            "metrics": settings.serving_metrics,
        }
        base = {**defaults, **{k: v for k, v in (recorded or {}).items() if k in defaults}}
        values = {**base, **{k: v for k, v in explicit.items() if k in defaults and v is not None}}
        if values["device"] == "gpu" and explicit.get("runtime") is None:
            values["runtime"] = "onnxruntime"  # a GPU is served by the native backend: the only one it has
        return cls(profile=profile, **values)
