"""The host's roofline and the model's cost per text: the physical limit every speed figure is read against.

A profile's rate alone says nothing about how much is left: 48 texts/s may be the CPU's limit or a tenth
of it. So the bench measures, on the cores it serves on, the memory bandwidth (a streaming copy) and the
matrix peak per precision (a short GEMM on the engine the profile runs on: ONNX Runtime for fp32 and
int8, OpenVINO for bf16), computes the model's FLOPs and weight bytes per text at the corpus's token
lengths, and reports each profile's rate as a fraction of

    roofline rate = min(peak FLOP/s / FLOPs per text, bandwidth / (weight bytes / texts per execution))

(the standard roofline: compute-bound, or memory-bound when every execution streams the weights once).
Figures measured with it are in docs/performance.md ("Roofline").
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import seqcls_engine

from seqcls_tools.bench.machine import machine_facts

log = logging.getLogger("seqcls_tools.bench")

#: Bytes per weight of each precision's matrices.
WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "int8": 1}
#: The precision a profile multiplies its encoder's matrices at.
PROFILE_PRECISION = {"classic": "fp32", "fp32": "fp32", "fp32-fused": "fp32", "int8": "int8", "bf16": "bf16"}
#: CPU flags that give each precision hardware matrix instructions beyond AVX2/AVX-512 FMA.
PRECISION_FLAGS = {
    "fp32": ("avx2", "avx512f", "amx_tile"),
    "bf16": ("avx512_bf16", "amx_bf16"),
    "int8": ("avx512_vnni", "avx_vnni", "amx_int8"),
}
Shapes = tuple[tuple[int, int, int], ...]
#: GEMM shapes (M, K, N) of the peak microbenchmark; the peak is the fastest. A square one, and a BERT-base
#: feed-forward layer at 32 and 128 tokens: ONNX Runtime's kernels can run a short, wide product faster than
#: the square, and a roof below what the model's own layers reach would not bound them.
PEAK_SHAPES: Shapes = ((1024, 1024, 1024), (32, 768, 3072), (128, 768, 3072))


@dataclass(frozen=True)
class Peak:
    """One precision's measured matrix peak."""

    precision: str
    gflops: float
    how: str


@dataclass(frozen=True)
class HostRoofline:
    """What this host can do at most, measured on ``threads`` cores."""

    cpu_model: str
    flags: tuple[str, ...]
    threads: int
    bandwidth_gb_s: float
    bandwidth_how: str
    peaks: dict[str, Peak]
    not_measured: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostRoofline:
        peaks = {k: Peak(**v) for k, v in data.get("peaks", {}).items()}
        return cls(**{**data, "flags": tuple(data.get("flags", ())), "peaks": peaks})


@dataclass(frozen=True)
class ModelShape:
    """A BERT-style encoder classifier's shape: what its cost per text depends on."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    labels: int

    @classmethod
    def from_config(cls, config: Path, labels: int) -> ModelShape:
        """From a checkpoint's ``config.json`` (PaddleNLP and Hugging Face name these fields alike)."""
        import json

        c = json.loads(Path(config).read_text(encoding="utf-8"))
        hidden = int(c["hidden_size"])
        return cls(
            layers=int(c["num_hidden_layers"]),
            hidden=hidden,
            intermediate=int(c.get("intermediate_size") or 4 * hidden),
            vocab=int(c.get("vocab_size") or 0),
            labels=labels,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelShape:
        """From :meth:`to_dict` (its derived counts are recomputed, not read)."""
        return cls(**{f: int(data[f]) for f in ("layers", "hidden", "intermediate", "vocab", "labels")})

    @property
    def encoder_matmul_params(self) -> int:
        """Weights of the encoder's matrices: Q, K, V, output (4 h²) and the feed-forward pair (2 h·i) per layer."""
        h, i = self.hidden, self.intermediate
        return self.layers * (4 * h * h + 2 * h * i)

    @property
    def head_params(self) -> int:
        """Pooler (h²) and classifier (h·labels): run once per text, on one token."""
        return self.hidden * self.hidden + self.hidden * self.labels

    def flops_per_text(self, tokens: float) -> float:
        """2 × encoder weights × tokens, attention's scores and weighted sum (2 × 2·T²·h per layer), the head."""
        attention = self.layers * 4 * tokens * tokens * self.hidden
        return 2 * self.encoder_matmul_params * tokens + attention + 2 * self.head_params

    def weight_bytes(self, precision: str) -> float:
        """Bytes one execution streams: the encoder's and head's matrices at ``precision`` (int8 keeps the head
        at fp32). The embedding table is not streamed: a text reads only its tokens' rows."""
        head = WEIGHT_BYTES["fp32"] if precision == "int8" else WEIGHT_BYTES[precision]
        return self.encoder_matmul_params * WEIGHT_BYTES[precision] + self.head_params * head

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "encoder_matmul_params": self.encoder_matmul_params, "head_params": self.head_params}


@dataclass(frozen=True)
class Bound:
    """The roofline rate of one execution shape and which side of the roof limits it."""

    texts_per_s: float
    limit: str  # "compute" | "memory"
    compute_texts_per_s: float
    memory_texts_per_s: float


def roofline_rate(
    *, peak_flops: float, bandwidth_bytes: float, flops_per_text: float, weight_bytes: float, batch: float
) -> Bound:
    """Texts/s at most: min(peak / FLOPs per text, bandwidth / (weight bytes / texts per execution))."""
    compute = peak_flops / flops_per_text
    memory = bandwidth_bytes * batch / weight_bytes
    return Bound(min(compute, memory), "compute" if compute <= memory else "memory", compute, memory)


def fraction(rate: float | None, bound: Bound) -> float | None:
    """``rate`` as a share of the roofline (None when not measured)."""
    return None if rate is None or bound.texts_per_s <= 0 else rate / bound.texts_per_s


# --- measurement -------------------------------------------------------------------------------------------


def _best(run: Callable[[], None], *, repeats: int, budget_s: float) -> float:
    """The fastest of up to ``repeats`` timed calls after one warm-up, within ``budget_s`` seconds."""
    run()
    best, t_end = math.inf, time.perf_counter() + budget_s
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() > t_end:
            break
    return best


def stream_bandwidth(threads: int, *, mb: int = 256, repeats: int = 5, budget_s: float = 3.0) -> tuple[float, str]:
    """Bytes/s of a streaming copy of ``mb`` MB (read + write counted, as STREAM's copy does), the array cut in
    one slice per thread: numpy's copy releases the GIL, so ``threads`` cores copy at once."""
    n = mb * 2**20 // 8
    src, dst = np.ones(n), np.zeros(n)
    bounds = np.linspace(0, n, threads + 1, dtype=np.int64)
    slices = [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]
    with ThreadPoolExecutor(threads) as pool:

        def copy() -> None:
            list(pool.map(lambda s: np.copyto(dst[s], src[s]), slices))

        seconds = _best(copy, repeats=repeats, budget_s=budget_s)
    how = f"numpy copy of {mb} MB float64, {threads} thread(s), best of {repeats}, read + write bytes"
    return 2 * src.nbytes / seconds, how


def _matmul_model(precision: str, m: int, k: int, n: int):
    """A one-node ONNX graph multiplying an input [m, k] by a constant weight [k, n] (int8: u8 × s8 → int32)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if precision == "int8":
        weight = numpy_helper.from_array(rng.integers(-127, 127, (k, n), dtype=np.int8), "W")
        op, types = "MatMulInteger", (TensorProto.UINT8, TensorProto.INT32)
    else:
        weight = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "W")
        op, types = "MatMul", (TensorProto.FLOAT, TensorProto.FLOAT)
    graph = helper.make_graph(
        [helper.make_node(op, ["A", "W"], ["Y"])],
        "gemm",
        [helper.make_tensor_value_info("A", types[0], [m, k])],
        [helper.make_tensor_value_info("Y", types[1], [m, n])],
        initializer=[weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _best_shape(precision: str, run_shape: Callable[[int, int, int], float], shapes: Shapes) -> Peak:
    """The fastest of ``shapes`` ((M, K, N), each timed by ``run_shape`` in seconds), as 2·M·K·N per second."""
    rates = {shape: 2 * math.prod(shape) / run_shape(*shape) for shape in shapes}
    (m, k, n), rate = max(rates.items(), key=lambda kv: kv[1])
    return Peak(precision, round(rate / 1e9, 1), f"[{m}×{k}]·[{k}×{n}], best of {len(shapes)} shapes")


def _ort_gemm(precision: str, threads: int, shapes: Shapes, budget_s: float) -> Peak:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    rng = np.random.default_rng(1)

    def run(m: int, k: int, n: int) -> float:
        graph = _matmul_model(precision, m, k, n).SerializeToString()
        session = ort.InferenceSession(graph, sess_options=opts, providers=["CPUExecutionProvider"])
        a = rng.integers(0, 255, (m, k), dtype=np.uint8) if precision == "int8" else rng.random((m, k), "f4")
        return _best(lambda: session.run(None, {"A": a}), repeats=50, budget_s=budget_s)

    peak = _best_shape(precision, run, shapes)
    op = "MatMulInteger (u8 × s8)" if precision == "int8" else "MatMul"
    return replace(peak, how=f"onnxruntime {ort.__version__} {op} {peak.how}, {threads} thread(s)")


def _openvino_gemm(threads: int, shapes: Shapes, budget_s: float) -> Peak:
    """fp32 MatMul compiled by OpenVINO at bf16, as the bf16 profile compiles its graph (``seqcls_engine``)."""
    import openvino as ov

    core = ov.Core()
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": threads}
    rng = np.random.default_rng(1)

    def run(m: int, k: int, n: int) -> float:
        model = core.read_model(_matmul_model("fp32", m, k, n).SerializeToString(), b"")
        compiled = core.compile_model(model, "CPU", config)
        used = compiled.get_property("INFERENCE_PRECISION_HINT")
        used_name = used.get_type_name() if hasattr(used, "get_type_name") else str(used)
        if used_name != "bf16":
            raise RuntimeError(f"OpenVINO compiled the GEMM at {used_name}, not bf16")
        request = compiled.create_infer_request()
        a = rng.random((m, k), "f4")
        return _best(lambda: request.infer({0: a}), repeats=50, budget_s=budget_s)

    peak = _best_shape("bf16", run, shapes)
    version = ov.__version__.split("-")[0]
    return replace(peak, how=f"OpenVINO {version} MatMul at bf16 (f32 in/out) {peak.how}, {threads} thread(s)")


def measure_host(threads: int | None = None, *, shapes: Shapes = PEAK_SHAPES, quick: bool = False) -> HostRoofline:
    """Bandwidth and the matrix peaks on ``threads`` cores (default: every usable one); about 5-10 s, ``quick``
    about 2 s. A precision the CPU has no instructions for, or whose engine is missing, is named, not faked."""
    t0 = time.perf_counter()
    facts = machine_facts()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, min(threads or usable, usable))
    flags = seqcls_engine.cpu_flags()
    budget = 0.15 if quick else 0.5  # per shape
    bandwidth, bandwidth_how = stream_bandwidth(threads, mb=64 if quick else 256, budget_s=6 * budget)
    peaks: dict[str, Peak] = {}
    missing: dict[str, str] = {}
    for precision in ("fp32", "int8"):
        peaks[precision] = _ort_gemm(precision, threads, shapes, budget)
    if not flags & set(PRECISION_FLAGS["int8"]):
        missing["int8 (VNNI/AMX)"] = "no avx512_vnni, avx_vnni or amx_int8: the int8 peak is ORT's AVX2 u8s8 path"
    if flags & set(PRECISION_FLAGS["bf16"]):
        try:
            peaks["bf16"] = _openvino_gemm(threads, shapes, budget)
        except (ImportError, RuntimeError) as exc:
            missing["bf16"] = f"OpenVINO bf16 GEMM did not run: {exc}"
    else:
        missing["bf16"] = "no avx512_bf16 or amx_bf16"
    host = HostRoofline(
        cpu_model=str(facts.get("cpu_model")),
        flags=tuple(sorted(f for fs in PRECISION_FLAGS.values() for f in fs if f in flags)),
        threads=threads,
        bandwidth_gb_s=round(bandwidth / 1e9, 2),
        bandwidth_how=bandwidth_how,
        peaks=peaks,
        not_measured=missing,
        seconds=round(time.perf_counter() - t0, 2),
    )
    log.info(
        "bench: roofline of %s (%s) on %d thread(s): copy %.1f GB/s, %s (%.1f s)",
        host.cpu_model,
        " ".join(host.flags) or "no matrix flags",
        threads,
        host.bandwidth_gb_s,
        ", ".join(f"{p} {v.gflops} GFLOP/s" for p, v in peaks.items()),
        host.seconds,
    )
    return host


# --- the report's rows -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One measured rate of a profile against its roofline."""

    profile: str
    where: str  # "served, 8 clients" | "served, 1 client" | "in process"
    precision: str
    batch: float
    texts_per_s: float | None
    roofline_texts_per_s: float
    limit: str
    fraction: float | None


def execution_batch(profile: str, options: Mapping[str, Any], model_batch: float | None) -> float:
    """Texts per model execution, the weight stream's reuse: 1 unless the served configuration pads a dynamic
    batch into one run (``pad-to-longest``). ``per-text`` runs each length on its own (equal lengths only share
    a run, rare on a corpus of mixed lengths), and the non-exact profiles run every text alone."""
    from seqcls.spec import EXACT_PROFILES

    if profile not in EXACT_PROFILES or not options.get("dynamic_batching"):
        return 1.0
    if options.get("batching") == "pad-to-longest" and model_batch:
        return float(model_batch)
    return 1.0


def _served_rates(results: Mapping[str, Any], name: str, entry: Mapping[str, Any]) -> dict[int, tuple[float, float]]:
    """clients → (sentences/s, Triton's mean model batch): 8 clients from the head-to-head's median (perf_analyzer
    first) when it ran, else the matrix; 1 client from the matrix."""
    from seqcls_tools.bench.ratios import cell_value

    top = max(results.get("meta", {}).get("clients", [8]))
    h2h = (results.get("head_to_head") or {}).get("configs", {}).get(name, {})
    out: dict[int, tuple[float, float]] = {}
    for clients in sorted({1, top}):
        rate = cell_value(dict(entry), clients, 1, "sentences_per_s")
        batch = (cell_value(dict(entry), clients, 1, "triton_batch") or {}).get("seqcls_model")
        if clients == top:
            rate = h2h.get(f"pa_median_{top}c_sentences_per_s") or h2h.get(f"median_{top}c_sentences_per_s") or rate
        if rate is not None:
            out[clients] = (float(rate), float(batch or 1.0))
    return out


def profile_rows(results: Mapping[str, Any]) -> list[Row]:
    """Every served profile's (classic and the main ones, not the variants) served and in-process rates against
    the roofline of its precision at its execution batch, at the corpus's mean token length."""
    roof = results.get("roofline") or {}
    if not roof.get("host") or not roof.get("model"):
        return []
    host = HostRoofline.from_dict(roof["host"])
    shape = ModelShape.from_dict(roof["model"]["shape"])
    flops = shape.flops_per_text(roof["model"]["tokens"])
    rows: list[Row] = []
    for name, entry in results.get("configs", {}).items():
        precision = PROFILE_PRECISION.get(entry.get("profile", ""))
        if entry.get("group") == "variant" or precision not in host.peaks or not entry.get("cells"):
            continue
        peak = host.peaks[precision].gflops * 1e9
        options = entry.get("options", {})
        measured = [
            (f"served, {c} client{'s' if c > 1 else ''}", rate, execution_batch(entry["profile"], options, batch))
            for c, (rate, batch) in sorted(_served_rates(results, name, entry).items(), reverse=True)
        ]
        inproc = (entry.get("inprocess") or {}).get("batch1", {}).get("sentences_per_s")
        measured.append(("in process", inproc, 1.0))
        for where, rate, batch in measured:
            bound = roofline_rate(
                peak_flops=peak,
                bandwidth_bytes=host.bandwidth_gb_s * 1e9,
                flops_per_text=flops,
                weight_bytes=shape.weight_bytes(precision),
                batch=batch,
            )
            rows.append(Row(name, where, precision, batch, rate, bound.texts_per_s, bound.limit, fraction(rate, bound)))
    return rows


def model_cost(shape: ModelShape, tokens: Mapping[str, Any]) -> dict[str, Any]:
    """The model's cost per text at the corpus's mean token length (the quadratic attention term is computed at
    the mean too: at these lengths it is about 1 % of the FLOPs)."""
    mean = float(tokens["mean"])
    return {
        "shape": shape.to_dict(),
        "tokens": mean,
        "tokens_from": f"corpus mean of {tokens.get('texts')} texts; median {tokens.get('median')}, "
        f"p95 {tokens.get('p95')}",
        "gflops_per_text": round(shape.flops_per_text(mean) / 1e9, 3),
        "weight_mb": {p: round(shape.weight_bytes(p) / 1e6, 1) for p in WEIGHT_BYTES},
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m seqcls_tools.bench.roofline``: this host's roofline alone, ``--repeat`` times (its spread on a
    shared machine), and the medium model's roofline rates at ``--tokens``."""
    import argparse
    import json

    from seqcls_tools.bench.model import MEDIUM

    parser = argparse.ArgumentParser(prog="python -m seqcls_tools.bench.roofline", description=main.__doc__)
    parser.add_argument("--threads", type=int, default=None, help="cores to measure on (default: every usable one)")
    parser.add_argument("--repeat", type=int, default=1, help="measure this many times")
    parser.add_argument("--tokens", type=float, default=30.0, help="tokens per text for the model's cost")
    args = parser.parse_args(argv)
    m = MEDIUM  # the bench's model builds intermediate = 4 × hidden (seqcls_tools.testing)
    shape = ModelShape(m.num_layers, m.hidden_size, 4 * m.hidden_size, m.vocab_size or 0, m.num_labels)
    flops = shape.flops_per_text(args.tokens)
    for _ in range(args.repeat):
        host = measure_host(args.threads)
        rates = {
            p: asdict(
                roofline_rate(
                    peak_flops=peak.gflops * 1e9,
                    bandwidth_bytes=host.bandwidth_gb_s * 1e9,
                    flops_per_text=flops,
                    weight_bytes=shape.weight_bytes(p),
                    batch=1,
                )
            )
            for p, peak in host.peaks.items()
        }
        print(json.dumps({"host": host.to_dict(), "medium_model_batch1": rates}, ensure_ascii=False))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
