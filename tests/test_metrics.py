"""Triton's Prometheus text, parsed as a scraper parses it (the live endpoint: tests/test_many_models.py)."""

from __future__ import annotations

from seqcls.serving import metrics

SAMPLE = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="seqcls_candidate",version="2"} 74
nv_inference_request_success{model="seqcls",version="1"} 3
nv_inference_request_failure{model="seqcls_candidate",version="2"} 1
nv_inference_count{model="seqcls_candidate",version="2"} 130
nv_gpu_utilization{gpu_uuid="GPU-x"} 0.5
nv_cpu_utilization 0.25
"""


def test_counts_of_one_model_version() -> None:
    counts = metrics.counts(metrics.parse(SAMPLE), "seqcls_candidate", 2)
    assert counts == {"nv_inference_request_success": 74, "nv_inference_request_failure": 1, "nv_inference_count": 130}
    assert metrics.counts(metrics.parse(SAMPLE), "alpha", 1) == dict.fromkeys(metrics.COUNTERS, 0.0)


def test_delta_is_what_happened_between_two_scrapes() -> None:
    before = metrics.counts(metrics.parse(SAMPLE), "seqcls", 1)
    after = metrics.counts(metrics.parse(SAMPLE.replace("} 3", "} 10")), "seqcls", 1)
    assert metrics.delta(before, after)["nv_inference_request_success"] == 7
