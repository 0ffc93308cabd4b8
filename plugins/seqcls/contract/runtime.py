"""Running a served graph outside Triton: ONNX Runtime sessions, and the serving padding.

:func:`feeds` batches and pads ids exactly as the served ensemble does (``seqcls_text.model_feeds``,
padded to the longest in a batch of :data:`BATCH`), so every reference — Paddle Inference, PyTorch
eager, ONNX Runtime — sees the same inputs and a difference is the runtime's, not the padding's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seqcls.contract import shipped
from seqcls.errors import GateError

BATCH = 16


def feeds(ids: Sequence[Sequence[int]], names: Sequence[str], pad_id: int = 0, size: int = BATCH):
    """Batches of ``{input name: [N, L] int64}`` for a graph taking ``names`` (the serving padding)."""
    text_mod = shipped.text()
    for start in range(0, len(ids), size):
        yield text_mod.model_feeds(ids[start : start + size], names, strategy="longest", pad_id=pad_id)


def choose_providers(provider: str, require_gpu: bool) -> list[str]:
    """ORT providers for the requested kind; ``require_gpu`` turns a missing CUDA EP into a gate failure."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    has_cuda = "CUDAExecutionProvider" in available
    if require_gpu and not has_cuda:
        raise GateError(
            f"require_gpu is set but ONNX Runtime offers no CUDAExecutionProvider (available: {available}); "
            "install onnxruntime-gpu on a GPU machine (requirements-gpu.txt) or unset require_gpu."
        )
    if provider == "cuda" and not has_cuda:
        raise GateError(f"provider 'cuda' asked for, but ONNX Runtime offers only {available}.")
    if provider in ("cuda", "auto") and has_cuda:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def session(onnx_path: Path, providers: list[str], *, profile: str, threads: int = 2):
    """The session ``profile`` serves ``onnx_path`` with: ONNX Runtime on ``providers``, or the profile's own
    engine (``bf16``: OpenVINO at bf16, ``seqcls_engine``) with the same ``run``/``get_inputs`` calls."""
    engine = shipped.engine()
    if profile in engine.ENGINES:
        try:
            return engine.session(onnx_path, profile, threads)
        except Exception as exc:
            raise GateError(
                f"{onnx_path.name} does not run as profile {profile!r}: {type(exc).__name__}: {exc}"
            ) from exc
    return ort_session(onnx_path, providers, threads)


def ort_session(onnx_path: Path, providers: list[str], threads: int = 2):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(onnx_path), sess_options=opts, providers=providers)


def ort_logits(session, ids: Sequence[Sequence[int]], pad_id: int = 0) -> np.ndarray:
    """ONNX Runtime's logits, fed exactly the inputs the graph declares."""
    c = shipped.contract()
    names = [i.name for i in session.get_inputs()]
    out = [session.run([c.LOGITS_OUTPUT], f)[0] for f in feeds(ids, names, pad_id)]
    return np.concatenate(out).astype(np.float32)
