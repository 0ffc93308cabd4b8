"""AMX-INT8 on OpenVINO against the ``int8`` profile: is an OpenVINO int8 profile worth adding?

On a CPU with ``amx_int8`` OpenVINO runs a statically quantized (QDQ) graph's matrix products on the AMX
tiles; the ``int8`` profile runs ONNX Runtime's dynamic quantization. This study puts them side by side on
the bench's ERNIE 3.0 medium shape (random weights), one text at a time, in process, with the served thread
count, in interleaved rounds (each way runs the whole text set per turn, after one untimed run):

- ``ort-int8``: the ``int8`` profile's served graph on ONNX Runtime (what is served today);
- ``openvino-int8-qdq``: the fp32 graph quantized statically (QDQ: MatMul weights int8 per output channel,
  activations uint8 per tensor from MinMax calibration on the release's golden texts; the head kept fp32 as
  ``int8`` keeps it), compiled by OpenVINO; the kernels its FullyConnected layers got are reported
  (``brgemm_avx512_amx_I8`` is AMX-INT8);
- ``openvino-bf16``: the ``bf16`` profile's engine on the same texts, for scale.

Each way's label decisions are compared with ONNX Runtime fp32 on the same texts (agreement over every
text × label, and the share of texts whose label set is unchanged). Run:
``python -m seqcls_tools.bench.amx_int8 --work DIR [--texts 400] [--rounds 5] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("seqcls_tools.bench")


def _feeds(release, texts: list[str]) -> list[dict[str, np.ndarray]]:
    """Each text alone, tokenized as serving does."""
    from seqcls.contract import shipped
    from seqcls.release.records import serving_tokenizer

    text_mod, serving = shipped.text(), serving_tokenizer(release)
    ids = text_mod.encode(serving.build(text_mod, release.config.max_length), texts)
    names = ["input_ids", "token_type_ids"]
    return [text_mod.model_feeds([row], names, strategy="longest", pad_id=serving.pad_id) for row in ids]


class _OpenVINO:
    """An ONNX graph compiled by OpenVINO on the CPU as ``seqcls_engine`` compiles bf16 (latency mode, no pinning)."""

    def __init__(self, path: Path, precision: str, threads: int) -> None:
        import openvino as ov

        core = ov.Core()
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision, "ENABLE_CPU_PINNING": False}
        config["INFERENCE_NUM_THREADS"] = threads
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.inputs = [p.get_any_name() for p in self.compiled.inputs]

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return self.request.infer({k: feed[k] for k in self.inputs})[self.compiled.outputs[0]].copy()

    def kernels(self) -> dict[str, int]:
        """The kernels OpenVINO chose for the matrix products (after a run: they are picked at the first one)."""
        seen: collections.Counter[str] = collections.Counter()
        for op in self.compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            if "layerType" in info and info["layerType"].astype(str) in ("FullyConnected", "MatMul"):
                seen[f"{info['runtimePrecision'].astype(str)} {info['primitiveType'].astype(str)}"] += 1
        return dict(seen)


class _Ort:
    def __init__(self, path: Path, threads: int) -> None:
        from seqcls.contract.runtime import ort_session

        self.session = ort_session(path, ["CPUExecutionProvider"], threads)
        self.inputs = [i.name for i in self.session.get_inputs()]

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(None, {k: feed[k] for k in self.inputs})[0]


def _agreement(logits: list[np.ndarray], reference: list[np.ndarray]) -> dict[str, float]:
    decided = [(a > 0, b > 0) for a, b in zip(logits, reference, strict=True)]  # sigmoid > 0.5
    return {
        "decision_agreement": round(float(np.mean([np.mean(a == b) for a, b in decided])), 4),
        "label_sets_unchanged": round(float(np.mean([np.array_equal(a, b) for a, b in decided])), 4),
        "max_abs_logit_diff": round(max(float(np.abs(a - b).max()) for a, b in zip(logits, reference, strict=True)), 4),
    }


def _quantize_static(src: Path, dst: Path, calibration: list[dict[str, np.ndarray]], *, labels: int) -> None:
    """QDQ: every MatMul with a weight initializer but the head's (its output is the labels) quantized, weights
    int8 per output channel, activations uint8 per tensor by MinMax over ``calibration``."""
    import os
    import tempfile

    import onnx
    from onnx import TensorProto
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    model = onnx.load(str(src), load_external_data=False)
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    head = [n.name for n in model.graph.node if n.op_type == "MatMul" and shapes.get(n.input[1], (0, 0))[-1] == labels]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="seqcls-amx-int8-") as tmp:
        os.chdir(tmp)  # the calibrator writes its augmented model into the working directory
        try:
            quantize_static(
                str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
                per_channel=True, reduce_range=False, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                nodes_to_exclude=head, calibrate_method=CalibrationMethod.MinMax,
                extra_options={"DefaultTensorType": TensorProto.FLOAT},
            )  # fmt: skip
        finally:
            os.chdir(cwd)
    quantized = sum(n.op_type == "DequantizeLinear" for n in onnx.load(str(dst), load_external_data=False).graph.node)
    log.info("bench: amx-int8: %s quantized (%d DequantizeLinear; head %s kept fp32)", dst.name, quantized, head)


def run(work: Path, n_texts: int, rounds: int) -> dict[str, Any]:
    from seqcls.release.records import served_onnx
    from seqcls.serving.repository import ServingOptions
    from seqcls.steps import run_release
    from seqcls_tools.bench.bf16_batching import medium_checkpoint
    from seqcls_tools.bench.corpus import make_corpus
    from seqcls_tools.bench.machine import loadavg, machine_facts
    from seqcls_tools.bench.profiles import bench_release, bench_settings

    corpus = make_corpus(2000, seed=0)
    checkpoint = medium_checkpoint(work, corpus)
    releases = {}
    for profile in ("fp32", "int8"):
        releases[profile] = bench_release(checkpoint, profile, bench_settings(work / "home"))
        run_release(releases[profile], until="convert")
    fp32_graph = releases["fp32"].workspace.path("onnx/model.onnx")
    texts = corpus[:n_texts]
    feeds = _feeds(releases["fp32"], texts)
    threads = ServingOptions().intra_op_threads
    qdq = work / "openvino-int8-qdq.onnx"
    if not qdq.is_file():
        _quantize_static(
            fp32_graph, qdq, _feeds(releases["fp32"], corpus[:64]), labels=releases["fp32"].checkpoint.num_labels
        )
    ways = {
        "ort-int8": _Ort(served_onnx(releases["int8"].workspace), threads),
        "openvino-int8-qdq": _OpenVINO(qdq, "f32", threads),
        "openvino-bf16": _OpenVINO(fp32_graph, "bf16", threads),
    }
    reference = [_Ort(fp32_graph, threads).run(f) for f in feeds]
    out: dict[str, Any] = {"machine": machine_facts(), "loadavg_start": loadavg(), "texts": len(feeds), "ways": {}}
    for name, way in ways.items():
        logits = [way.run(f) for f in feeds]  # also the warm-up: every length once
        out["ways"][name] = {**_agreement(logits, reference), "rates": []}
        if isinstance(way, _OpenVINO):
            out["ways"][name]["kernels"] = way.kernels()
    for r in range(rounds):
        for name, way in ways.items():
            way.run(feeds[0])  # untimed: its weights back in the caches
            t0 = time.perf_counter()
            for f in feeds:
                way.run(f)
            out["ways"][name]["rates"].append(round(len(feeds) / (time.perf_counter() - t0), 1))
        log.info("bench: amx-int8 round %d: %s", r + 1, {n: w["rates"][-1] for n, w in out["ways"].items()})
    base = statistics.median(out["ways"]["ort-int8"]["rates"])
    for way in out["ways"].values():
        way["sentences_per_s"] = statistics.median(way["rates"])
        way["vs_ort_int8"] = round(way["sentences_per_s"] / base, 2)
    out["loadavg_end"] = loadavg()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="directory for the checkpoint and releases")
    parser.add_argument("--texts", type=int, default=400, help="corpus texts timed and compared")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the results (JSON) here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    out = run(args.work.resolve(), args.texts, args.rounds)  # the quantizer writes from another directory
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, default=str), encoding="utf-8")
    for name, way in out["ways"].items():
        log.info("bench: amx-int8 %s: %s", name, {k: v for k, v in way.items() if k != "rates"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
