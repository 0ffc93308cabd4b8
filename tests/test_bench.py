"""``seqcls bench --quick``: the whole benchmark on a tiny model — output well-formed, nothing left running.

Checks structure only (keys, table rows, files), never timing values: the machine may be busy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PROFILES = ("classic", "fp32", "fp32-fused", "int8")
CELL_KEYS = ("sentences_per_s", "p50_ms", "p95_ms", "p99_ms", "triton_batch", "cpu_cores", "rss", "failed")


def _our_servers(root: Path) -> list[str]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if "tritonserver" in cmd and str(root) in cmd:
            found.append(cmd[:200])
    return found


def test_bench_quick_cli(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    env = {**os.environ, "SEQCLS_HOME": str(tmp_path / "home"), "GLOG_minloglevel": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "bench", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not _our_servers(tmp_path), "a Triton server outlived the benchmark"
    assert not (out / "work").exists()  # work dir removed unless --keep-work

    # stdout: the report, then the ratios last
    stdout = proc.stdout.strip().splitlines()
    ratio_start = stdout.index("ratios vs targets:")
    ratio_lines = stdout[ratio_start + 1 :]
    assert ratio_lines and all(line.startswith(("PASS ", "MISS ", "INFO ")) for line in ratio_lines)
    assert any("vs classic" in line for line in ratio_lines)

    results = json.loads((out / "results.json").read_text())
    assert {
        "meta",
        "model",
        "corpus",
        "releases",
        "tokenizers",
        "configs",
        "hot_reload",
        "head_to_head",
        "ratios",
    } <= set(results)
    assert results["meta"]["mode"] == "quick" and results["meta"]["loadavg_start"]
    assert set(results["releases"]) == {"fp32", "fp32-fused", "int8"}
    for rel in results["releases"].values():
        assert {"steps", "gate_passed", "gate"} <= set(rel)
    assert results["releases"]["fp32-fused"]["convert"]["optimize"]["attention_fused"] >= 1
    assert {"hf/batch1", "paddlenlp/batch1"} <= set(results["tokenizers"])
    assert set(PROFILES) <= set(results["configs"])
    for name in PROFILES:
        entry = results["configs"][name]
        if entry.get("skipped"):  # int8 only, and only if its gate failed
            assert name == "int8"
            continue
        assert len(entry["cells"]) == 6, name  # 1/4/8 clients x 1/8 texts
        for cell in entry["cells"]:
            assert set(CELL_KEYS) <= set(cell)
            assert cell["failed"] == 0 and cell["texts"] > 0
        assert {"batch1", "batch8"} <= set(entry["inprocess"])
        assert entry["max_rss_mb"]["tokenizer"] > 0 and entry["max_rss_mb"]["server"] > 0
    assert results["configs"]["classic"]["options"]["tokenizer_impl"] == "paddlenlp"
    hr = results["hot_reload"]
    assert hr["requests"] > 0 and hr["failed"] == 0 and hr["reload_seconds"] > 0
    h2h = results["head_to_head"]["configs"]
    assert "classic" in h2h and len(h2h) >= 2
    for entry in h2h.values():
        assert entry["median_8c_sentences_per_s"] > 0 and entry["median_1c_p95_ms"] > 0
    # perf_analyzer (installed by `make test`: make setup-perf + scripts/system-deps.sh) drove every cell too
    assert results["head_to_head"]["perf_analyzer"], "no perf_analyzer: run `make setup-perf`"
    for name, entry in h2h.items():
        pa = entry["perf_analyzer"]
        assert len(pa) == 2 * results["head_to_head"]["rounds"] and not [c for c in pa if "error" in c], (name, pa)
        assert all(c["sentences_per_s"] > 0 and c["p95_ms"] > 0 and c["client_cores"] >= 0 for c in pa), pa
        assert entry["pa_median_8c_sentences_per_s"] > 0
    headline = next(r for r in results["ratios"] if r["key"] == "exact_vs_classic")
    assert "perf_analyzer" in headline["what"] and headline["python_client"]["value"] > 0, headline
    keys = {r["key"] for r in results["ratios"]}
    assert {"exact_vs_classic", "fastest_vs_classic", "tokenizer_rss_mb", "hot_reload_failed"} <= keys
    assert any(k.startswith("multi_text_vs_single[") for k in keys)
    assert any(k.startswith("every_concurrency_vs_classic[") for k in keys)
    for r in results["ratios"]:
        if r["key"].startswith(("multi_text_vs_single[", "every_concurrency_vs_classic[")):
            assert r["value"] and r["baseline"] and r["ratio"] == round(r["value"] / r["baseline"], 2), r

    md = (out / "results.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| ")]
    for name in PROFILES:
        rows = [line for line in table if line.startswith(f"| {name} | tokenizer ")]
        assert len(rows) == (0 if results["configs"][name].get("skipped") else 6), name
    assert "## Ratios vs targets" in md
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
