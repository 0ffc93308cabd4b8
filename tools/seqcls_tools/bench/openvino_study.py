"""Is OpenVINO an exact profile that beats ONNX Runtime on this CPU? (issue 16)

The bench's model (``--spec medium``, seed 0, built and converted as :mod:`.int8_study` does,
sharing its ``--work`` directory) is run per text, unpadded, by each candidate runtime:

- ``ort-fp32`` — ONNX Runtime on the converted graph (what profile ``fp32`` serves);
- ``ort-fp32-fused`` — ONNX Runtime on the fused graph (profile ``fp32-fused``);
- ``ov-f32`` — OpenVINO, dynamic shapes, ``INFERENCE_PRECISION_HINT=f32``, LATENCY hint;
- ``ov-f32-2req`` — the same model compiled with the THROUGHPUT hint, two requests in flight;
- ``ov-default`` — OpenVINO's default precision (bf16 on a CPU with AMX/AVX512_BF16): shown
  because it is what an unconfigured OpenVINO does, not as an exact candidate.

Each is gated like ``fp32`` (Paddle Inference logits on the golden texts, the release's
atol/rtol, identical thresholded label sets) and timed in-process (2 threads, pre-tokenized
single texts, rounds interleaved, medians). OpenVINO is not a dependency of seqcls; install it
beside the venv for this study only::

    .venv/bin/python -m pip install --target /tmp/ovpkgs openvino
    PYTHONPATH=/tmp/ovpkgs .venv/bin/python -m seqcls_tools.bench.openvino_study

Results go to ``<work>/openvino_study.json`` and a table on stdout (about 5 minutes on 2 cores
once the checkpoint exists).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("seqcls_tools.bench.openvino_study")

Runner = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


def _feeds(names: Sequence[str], ids: np.ndarray) -> dict[str, np.ndarray]:
    from seqcls.profiles.checks import feeds_for

    return feeds_for(names, ids[None, :], [len(ids)])


def ort_runner(path: Path, threads: int) -> Runner:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda seqs: [session.run(["logits"], _feeds(names, s))[0][0] for s in seqs]


def ov_runner(path: Path, threads: int, *, precision: str | None, requests: int = 1) -> tuple[Runner, str]:
    """An OpenVINO runner (and the inference precision it actually uses)."""
    import openvino as ov

    core = ov.Core()
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads}
    config["PERFORMANCE_HINT"] = "LATENCY" if requests == 1 else "THROUGHPUT"
    if requests > 1:
        config["NUM_STREAMS"] = requests
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    model = core.read_model(str(path))
    names = [i.get_any_name() for i in model.inputs]
    compiled = core.compile_model(model, "CPU", config)
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    used = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
    if requests == 1:
        request = compiled.create_infer_request()

        def run(seqs: Sequence[np.ndarray]) -> list[np.ndarray]:
            return [np.array(request.infer(_feeds(names, s))[0][0]) for s in seqs]

        return run, used
    queue = ov.AsyncInferQueue(compiled, requests)

    def run_async(seqs: Sequence[np.ndarray]) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [None] * len(seqs)

        def done(req, i: int) -> None:
            out[i] = np.array(req.get_output_tensor(0).data[0])

        queue.set_callback(done)
        for i, s in enumerate(seqs):
            queue.start_async(_feeds(names, s), i)
        queue.wait_all()
        return out  # type: ignore[return-value]

    return run_async, used


def gate(release, ref: np.ndarray, got: Sequence[np.ndarray]) -> dict[str, Any]:
    """What the ``fp32`` gate would say: logits within atol/rtol, identical label sets."""
    from seqcls.serving import shipped

    decide, cfg = shipped.decide(), release.config
    thresholds = decide.threshold_vector(list(release.checkpoint.labels), cfg.threshold, cfg.thresholds)
    logits = np.stack(got)
    same_sets = (decide.sigmoid(logits) >= thresholds) == (decide.sigmoid(ref) >= thresholds)
    return {
        "max_abs_logit_diff": float(np.abs(logits - ref).max()),
        "within_tolerance": bool(np.allclose(logits, ref, atol=cfg.atol, rtol=cfg.rtol)),
        "changed_sets": int((~same_sets.all(axis=1)).sum()),
    }


def timed(runners: dict[str, Runner], seqs: Sequence[np.ndarray], rounds: int) -> dict[str, float]:
    rates: dict[str, list[float]] = {n: [] for n in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            t0 = time.perf_counter()
            run(seqs)
            rates[name].append(len(seqs) / (time.perf_counter() - t0))
    return {n: round(statistics.median(v), 1) for n, v in rates.items()}


def main(argv: list[str] | None = None) -> None:
    from seqcls.gates import parity
    from seqcls.profiles.optimize import optimize_onnx
    from seqcls.records import fp32_onnx, static_dir
    from seqcls.steps import run_release
    from seqcls.steps.validate import serving_ids
    from seqcls_tools.bench.int8_study import bench_checkpoint, release_for
    from seqcls_tools.bench.model import MEDIUM, TINY

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", choices=("medium", "tiny"), default="medium")
    parser.add_argument("--work", type=Path, default=Path("/tmp/seqcls-int8-study"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)

    spec = MEDIUM if args.spec == "medium" else TINY
    ckpt, corpus = bench_checkpoint(args.work, spec, 0, 2000, 64)
    home = ckpt.parent / "home"
    release = release_for(ckpt, "fp32", home)
    run_release(release, until="convert")
    fp32 = fp32_onnx(release.workspace)
    fused = home / "candidates" / "fp32-fused.onnx"
    if not fused.is_file():
        fused.parent.mkdir(parents=True, exist_ok=True)
        optimize_onnx(fp32, fused, "fp32-fused", num_heads=spec.num_heads, hidden_size=spec.hidden_size)
    texts = corpus[-64:]
    seqs = [np.asarray(x, dtype=np.int64) for x in serving_ids(release, texts)]
    ref = parity.paddle_logits(static_dir(release.workspace), [s.tolist() for s in seqs])  # as the gate batches them

    runners: dict[str, Runner] = {
        "ort-fp32": ort_runner(fp32, args.threads),
        "ort-fp32-fused": ort_runner(fused, args.threads),
    }
    precision: dict[str, str] = {"ort-fp32": "f32", "ort-fp32-fused": "f32"}
    for name, prec, requests in (("ov-f32", "f32", 1), ("ov-f32-2req", "f32", 2), ("ov-default", None, 1)):
        runners[name], precision[name] = ov_runner(fp32, args.threads, precision=prec, requests=requests)
    rows = {name: {"precision": precision[name], **gate(release, ref, run(seqs))} for name, run in runners.items()}
    speed = timed(runners, seqs, args.rounds)
    base = speed["ort-fp32"]
    for name, row in rows.items():
        row["sentences_per_s"], row["vs_ort_fp32"] = speed[name], round(speed[name] / base, 2)
    out = {"spec": spec.to_dict(), "texts": len(seqs), "threads": args.threads, "rounds": args.rounds, "rows": rows}
    (args.work / "openvino_study.json").write_text(json.dumps(out, indent=1), encoding="utf-8")
    lines = [f"{'runtime':16s} {'precision':10s} {'max|Δlogit|':>12s} {'exact':>6s} {'sets':>5s} {'sent/s':>7s} ×ort"]
    for name, r in rows.items():
        lines.append(
            f"{name:16s} {r['precision']:10s} {r['max_abs_logit_diff']:12.2e} {r['within_tolerance']!s:>6s} "
            f"{r['changed_sets']:5d} {r['sentences_per_s']:7.1f} {r['vs_ort_fp32']:5.2f}"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
