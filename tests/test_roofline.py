"""The bench's roofline (issue 40): its arithmetic on known inputs, the report's rows and formatting, and one real
measurement of this host checked only where it can fail honestly (no timing targets: the machine may be busy)."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest
import seqcls_engine

from seqcls_tools.bench import markdown, roofline
from seqcls_tools.bench.roofline import Bound, ModelShape, roofline_rate

#: ERNIE 3.0 medium's shape, the full bench's model.
MEDIUM = ModelShape(layers=6, hidden=768, intermediate=3072, vocab=40000, labels=74)


def test_roofline_rate_is_the_lower_of_compute_and_memory() -> None:
    # 100 GFLOP/s over 2 GFLOP per text: 50 texts/s; 10 GB/s over 400 MB per execution: 25 executions/s
    one = roofline_rate(peak_flops=100e9, bandwidth_bytes=10e9, flops_per_text=2e9, weight_bytes=400e6, batch=1)
    assert one == Bound(25.0, "memory", 50.0, 25.0)
    # 4 texts share each weight stream: 100 texts/s from memory, so compute (50) limits
    four = roofline_rate(peak_flops=100e9, bandwidth_bytes=10e9, flops_per_text=2e9, weight_bytes=400e6, batch=4)
    assert four == Bound(50.0, "compute", 50.0, 100.0)
    assert roofline.fraction(20.0, one) == pytest.approx(0.8)
    assert roofline.fraction(20.0, four) == pytest.approx(0.4)
    assert roofline.fraction(None, four) is None


def test_medium_model_cost_per_text() -> None:
    # per layer 4·768² (Q, K, V, output) + 2·768·3072 (feed-forward) = 7,077,888 weights
    assert MEDIUM.encoder_matmul_params == 6 * 7_077_888 == 42_467_328
    assert MEDIUM.head_params == 768 * 768 + 768 * 74
    flops = 2 * 42_467_328 * 30 + 6 * 4 * 30 * 30 * 768 + 2 * (768 * 768 + 768 * 74)
    assert MEDIUM.flops_per_text(30) == flops
    assert MEDIUM.flops_per_text(30) / 1e9 == pytest.approx(2.566, abs=1e-3)
    assert MEDIUM.weight_bytes("fp32") == 4 * (42_467_328 + MEDIUM.head_params)
    assert MEDIUM.weight_bytes("bf16") == 2 * (42_467_328 + MEDIUM.head_params)
    assert MEDIUM.weight_bytes("int8") == 42_467_328 + 4 * MEDIUM.head_params  # int8 keeps the head at fp32
    assert ModelShape.from_dict(MEDIUM.to_dict()) == MEDIUM


def test_model_shape_from_a_checkpoint_config(tmp_path) -> None:
    import json

    config = {"hidden_size": 768, "num_hidden_layers": 6, "intermediate_size": 3072, "vocab_size": 40000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert ModelShape.from_config(tmp_path / "config.json", labels=74) == MEDIUM


def _results(host: roofline.HostRoofline, shape: ModelShape, tokens: float) -> dict:
    def cells(rate8: float, rate1: float, batch8: float) -> list[dict]:
        return [
            {"clients": 8, "texts_per_request": 1, "sentences_per_s": rate8, "triton_batch": {"seqcls_model": batch8}},
            {"clients": 1, "texts_per_request": 1, "sentences_per_s": rate1, "triton_batch": {"seqcls_model": 1.0}},
        ]

    per_text = {"dynamic_batching": True, "batching": "per-text"}
    return {
        "meta": {"clients": [1, 4, 8]},
        "roofline": {"host": host.to_dict(), "model": roofline.model_cost(shape, {"mean": tokens})},
        "configs": {
            "classic": {
                "profile": "fp32",
                "group": "classic",
                "options": {"dynamic_batching": False},
                "cells": cells(8.0, 6.0, 1.0),
                "inprocess": {"batch1": {"sentences_per_s": 9.0}},
            },
            "fp32": {
                "profile": "fp32",
                "group": "main",
                "options": per_text,
                "cells": cells(99.0, 7.0, 4.0),
                "inprocess": {"batch1": {"sentences_per_s": 10.0}},
            },
            "fp32 pad-to-longest": {
                "profile": "fp32",
                "group": "variant",
                "options": {"dynamic_batching": True, "batching": "pad-to-longest"},
                "cells": cells(12.0, 6.0, 4.0),
            },
            "int8": {
                "profile": "int8",
                "group": "main",
                "options": per_text,
                "cells": cells(30.0, 20.0, 4.0),
                "inprocess": {"batch1": {"sentences_per_s": 25.0}},
            },
            "bf16": {"profile": "bf16", "group": "main", "options": per_text, "skipped": "parity gate failed"},
        },
        # 8 clients come from the interleaved head-to-head (perf_analyzer's median), not the matrix's 99
        "head_to_head": {"configs": {"fp32": {"pa_median_8c_sentences_per_s": 11.0}}},
    }


def test_each_profile_against_the_roofline_of_its_precision() -> None:
    # 1 layer, hidden 10, intermediate 20: 800 encoder weights + 100 + 20 head; at 5 tokens 2·800·5 + 4·5²·10
    # (attention) + 2·120 = 9,240 FLOP per text. fp32 peak 92.4 kFLOP/s: 10 texts/s; int8 369.6 kFLOP/s: 40.
    shape = ModelShape(layers=1, hidden=10, intermediate=20, vocab=50, labels=2)
    assert shape.flops_per_text(5) == 9_240
    fp32 = roofline.Peak("fp32", 92.4e-6, "hand-written")
    int8 = roofline.Peak("int8", 369.6e-6, "hand-written")
    # bandwidth 1 kB/s: fp32 streams 3,680 B per execution (0.27 texts/s alone); int8 1,280 B (0.78 texts/s)
    host = roofline.HostRoofline("CPU", ("avx2",), 2, 1e-6, "hand-written", {"fp32": fp32, "int8": int8})
    rows = {(r.profile, r.where): r for r in roofline.profile_rows(_results(host, shape, 5.0))}
    assert {p for p, _ in rows} == {"classic", "fp32", "int8"}  # no variant, nothing for an unserved profile
    served = rows["fp32", "served, 8 clients"]
    assert served.batch == 1.0 and served.texts_per_s == 11.0  # per-text: each text its own run
    assert served.limit == "memory" and served.roofline_texts_per_s == pytest.approx(1000 / 3680)
    assert served.fraction == pytest.approx(11.0 / (1000 / 3680))
    assert rows["int8", "in process"].fraction == pytest.approx(25.0 / (1000 / 1280))
    assert rows["classic", "served, 1 client"].texts_per_s == 6.0

    fast = roofline.HostRoofline("CPU", ("avx2",), 2, 1.0, "hand-written", {"fp32": fp32, "int8": int8})
    rows = {(r.profile, r.where): r for r in roofline.profile_rows(_results(fast, shape, 5.0))}
    assert rows["fp32", "served, 8 clients"].limit == "compute"
    assert rows["fp32", "served, 8 clients"].fraction == pytest.approx(11.0 / 10.0)
    assert rows["fp32", "in process"].fraction == pytest.approx(1.0)
    assert rows["int8", "served, 8 clients"].fraction == pytest.approx(30.0 / 40.0)
    assert rows["classic", "served, 8 clients"].fraction == pytest.approx(0.8)


def test_execution_batch_counts_shared_weight_streams_only() -> None:
    pad = {"dynamic_batching": True, "batching": "pad-to-longest"}
    assert roofline.execution_batch("fp32", pad, 3.5) == 3.5
    assert roofline.execution_batch("fp32", {"dynamic_batching": True, "batching": "per-text"}, 3.5) == 1.0
    assert roofline.execution_batch("fp32", {**pad, "dynamic_batching": False}, 3.5) == 1.0
    assert roofline.execution_batch("int8", pad, 3.5) == 1.0  # non-exact profiles run every text alone
    assert roofline.execution_batch("bf16", pad, 3.5) == 1.0


def test_report_prints_the_roofline_and_every_fraction() -> None:
    shape = ModelShape(layers=1, hidden=10, intermediate=20, vocab=50, labels=2)
    fp32 = roofline.Peak("fp32", 92.4e-6, "onnxruntime MatMul")
    host = roofline.HostRoofline("Some CPU 9000", ("avx2", "avx512_bf16"), 2, 1.0, "numpy copy", {"fp32": fp32})
    results = _results(host, shape, 5.0)
    results["roofline"]["profiles"] = [asdict(r) for r in roofline.profile_rows(results)]
    lines = markdown.roofline_section(results)
    text = "\n".join(lines)
    assert "## Roofline" in text and "Some CPU 9000" in text and "avx2, avx512_bf16" in text
    assert "**1.0 GB/s**" in text and "fp32 **0 GFLOP/s** (onnxruntime MatMul)" in text
    assert "| fp32 | served, 8 clients | fp32 | 1 | 11.0 | 10.0 | compute | 1.10 |" in lines
    assert "| fp32 | in process | fp32 | 1 | 10.0 | 10.0 | compute | 1.00 |" in lines
    assert not [line for line in lines if line.startswith("| int8 ")]  # no int8 peak measured: no row
    assert "- no row for bf16 (parity gate failed)" in lines
    assert markdown.roofline_section({}) == []


def test_client_cores_keep_two_decimals() -> None:
    """results.md printed perf_analyzer's 0.02–0.04 client cores as 0.0 (issue 40)."""
    assert [markdown._cores(v) for v in (0.03, 0.025, 0.004, 0.0, 1.5, None)] == [
        "0.03",
        "0.03",
        "< 0.01",
        "0.00",
        "1.50",
        "—",
    ]
    h2h = {"perf_analyzer": "pa", "rounds": 1, "seconds_per_cell": 1, "configs": {"int8": {}}}
    h2h["configs"]["int8"] = {"pa_median_8c_sentences_per_s": 150.0, "pa_median_8c_client_cores": 0.03}
    lines = markdown._head_to_head({"meta": {"clients": [1, 8]}, "head_to_head": h2h})
    assert "| int8 | 150.0 | — | 0.03 |" in lines


@pytest.mark.slow
def test_this_host_measured_roofline_bounds_the_model_s_own_gemms() -> None:
    """A real measurement (seconds): bandwidth and peaks are finite and positive, the bf16 peak is measured
    exactly where the CPU multiplies bf16, and the model's other layer shapes at 40 tokens (attention's output
    projection, the second feed-forward product), timed apart from the peak's shapes, run no faster than the
    fp32 roof: a peak measured on too few shapes, or counted with the wrong FLOPs, fails here. Peak and layers
    alternate over three rounds and each side keeps its best, so a busy machine slows both alike."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    layers = {}
    for m, k, n in ((40, 768, 768), (40, 3072, 768)):
        graph = roofline._matmul_model("fp32", m, k, n).SerializeToString()
        session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
        layers[m, k, n] = (session, np.random.default_rng(1).random((m, k), dtype=np.float32))
    peak, achieved = 0.0, 0.0
    flags = seqcls_engine.cpu_flags()
    for _ in range(3):
        host = roofline.measure_host(2, quick=True)
        assert math.isfinite(host.bandwidth_gb_s) and host.bandwidth_gb_s > 0
        assert host.threads >= 1 and host.seconds < 30 and host.cpu_model
        assert ("bf16" in host.peaks) == bool(flags & {"avx512_bf16", "amx_bf16"}), (host.peaks, host.not_measured)
        assert all(math.isfinite(p.gflops) and p.gflops > 0 for p in host.peaks.values()), host.peaks
        peak = max(peak, host.peaks["fp32"].gflops)
        for (m, k, n), (session, a) in layers.items():
            seconds = roofline._best(lambda s=session, a=a: s.run(None, {"A": a}), repeats=30, budget_s=0.3)
            achieved = max(achieved, 2 * m * k * n / seconds / 1e9)
    if flags & {"avx512_vnni", "amx_int8"}:  # VNNI's u8×s8 dot products do 4× fp32's multiply-adds per lane
        assert host.peaks["int8"].gflops > host.peaks["fp32"].gflops, host.peaks
    assert achieved <= 1.2 * peak, (achieved, peak)


def test_the_module_prints_each_measurement_with_the_medium_model_s_roof(monkeypatch, capsys) -> None:
    import json

    peaks = {"fp32": roofline.Peak("fp32", 200.0, "x"), "int8": roofline.Peak("int8", 800.0, "y")}
    host = roofline.HostRoofline("CPU", ("avx2",), 2, 20.0, "copy", peaks)
    monkeypatch.setattr(roofline, "measure_host", lambda threads: host)
    roofline.main(["--repeat", "2", "--tokens", "30"])
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(out) == 2 and out[0]["host"]["bandwidth_gb_s"] == 20.0
    fp32 = out[0]["medium_model_batch1"]["fp32"]
    assert fp32["compute_texts_per_s"] == pytest.approx(200e9 / MEDIUM.flops_per_text(30))
    assert fp32["memory_texts_per_s"] == pytest.approx(20e9 / MEDIUM.weight_bytes("fp32"))
    assert fp32["limit"] == "compute" and out[0]["medium_model_batch1"]["int8"]["limit"] == "compute"
