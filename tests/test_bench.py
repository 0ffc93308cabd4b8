"""``seqcls bench --quick``: the whole benchmark on a tiny model — output well-formed, nothing left running.

Checks structure only (keys, table rows, files, the conditions each table names, how a lone
request's parts add up), never timing values: the machine may be busy. The unit tests at the top
run the lone-request arithmetic and the conditions line on hand-written Triton statistics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROFILES = ("classic", "fp32", "fp32-fused", "int8")
#: the CPU flags every conditions line names, present or absent (issue 26)
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
CONDITION_SECTIONS = (
    "serving",
    "head_to_head",
    "lone",
    "inprocess",
    "memory",
    "tokenizers",
    "releases",
    "batch_dependence",
    "hot_reload",
    "roofline",
)
CELL_KEYS = ("sentences_per_s", "p50_ms", "p95_ms", "p99_ms", "triton_batch", "cpu_cores", "rss", "failed")


def _stats(**parts: tuple[int, int]) -> dict:
    """One model's ``get_inference_statistics(as_json=True)`` as Triton writes it: 64-bit numbers as
    strings, zero fields left out, one entry per loaded version."""
    inference = {k: {"count": str(c), "ns": str(ns)} for k, (c, ns) in parts.items() if c or ns}
    return {"model_stats": [{"name": "m", "version": "1", "inference_stats": inference}]}


def test_lone_breakdown_splits_client_latency_by_triton_statistics() -> None:
    from seqcls_tools.bench import lone

    composing = ("tokenizer", "seqcls_model", "seqcls_postprocess")
    before = {m: lone.parse_statistics(_stats()) for m in (*composing, "seqcls")}
    ms = 1_000_000
    after = {
        "tokenizer": lone.parse_statistics(
            _stats(success=(4, 9 * ms), queue=(4, 1 * ms), compute_input=(4, 1 * ms), compute_infer=(4, 6 * ms))
        ),
        "seqcls_model": lone.parse_statistics(
            _stats(success=(4, 21 * ms), queue=(4, 2 * ms), compute_infer=(4, 16 * ms), compute_output=(4, 2 * ms))
        ),
        "seqcls_postprocess": lone.parse_statistics(_stats(success=(4, 5 * ms), compute_infer=(4, 4 * ms))),
        "seqcls": lone.parse_statistics(_stats(success=(4, 40 * ms))),
    }
    out = lone.breakdown(before, after, [11.0, 12.0, 12.0, 13.0], ensemble="seqcls", composing=composing)
    assert out["requests"] == out["ensemble_requests"] == 4
    assert out["client_mean_ms"] == 12.0 and out["client_p50_ms"] == 12.0 and out["ensemble_ms"] == 10.0
    tok = out["models"]["tokenizer"]
    assert (tok["queue_ms"], tok["compute_input_ms"], tok["compute_infer_ms"], tok["compute_output_ms"]) == (
        0.25,
        0.25,
        1.5,
        0.0,
    )
    assert [p["ms"] for p in out["parts"]] == [2.0, 4.5, 1.0, 4.5]  # own work; the remainder is 12 - (2 + 4.5 + 1)
    assert out["parts"][-1]["part"] == lone.REMAINDER
    assert sum(p["ms"] for p in out["parts"]) == pytest.approx(out["client_mean_ms"])
    assert sum(p["share"] for p in out["parts"]) == pytest.approx(1.0)
    assert out["remainder"] == {"hand_offs_ms": 0.5, "outside_ensemble_ms": 2.0}
    with pytest.raises(ValueError, match="no successful request"):
        lone.breakdown(before, after, [], ensemble="seqcls", composing=composing)


def test_lone_remainder_is_not_negative_when_hand_offs_overlap_the_next_step() -> None:
    """The CI run that failed (classic, 2026-12-03): the postprocess's compute_output (2.54 ms) held the
    reply to the client, and the ensemble's own total (11.53 ms) outlasted the client's mean (11.29 ms).
    A model's own part ends at compute_end, before its response is sent: those parts do not overlap, so
    the remainder they leave is ≥ 0 by construction, and the hand-offs are counted in it."""
    from seqcls_tools.bench import lone

    composing = ("tokenizer", "seqcls_model", "seqcls_postprocess")
    before = {m: lone.parse_statistics(_stats()) for m in (*composing, "seqcls")}
    n, us = 100, 1_000

    def model(queue: float, inp: float, infer: float, output: float) -> dict:
        total = queue + inp + infer + output
        return lone.parse_statistics(
            _stats(
                success=(n, round(n * total * 1e3) * us),
                queue=(n, round(n * queue * 1e3) * us),
                compute_input=(n, round(n * inp * 1e3) * us),
                compute_infer=(n, round(n * infer * 1e3) * us),
                compute_output=(n, round(n * output * 1e3) * us),
            )
        )

    after = {
        "tokenizer": model(0.3706, 0.054, 2.3572, 0.5124),
        "seqcls_model": model(0.1051, 0.0418, 2.735, 0.1241),
        "seqcls_postprocess": model(0.1286, 0.0507, 2.8854, 2.5444),
        "seqcls": lone.parse_statistics(_stats(success=(n, round(n * 11.5265 * 1e3) * us))),
    }
    out = lone.breakdown(before, after, [11.2899] * n, ensemble="seqcls", composing=composing)
    parts = {p["part"]: p["ms"] for p in out["parts"]}
    assert parts["tokenizer"] == pytest.approx(0.3706 + 0.054 + 2.3572)
    assert parts["seqcls_postprocess"] == pytest.approx(0.1286 + 0.0507 + 2.8854)
    assert min(parts.values()) >= 0, parts
    assert parts[lone.REMAINDER] == pytest.approx(11.2899 - 8.7284, abs=1e-3)
    assert out["remainder"]["hand_offs_ms"] == pytest.approx(0.5124 + 0.1241 + 2.5444, abs=1e-3)
    assert out["remainder"]["outside_ensemble_ms"] == pytest.approx(11.2899 - 11.5265, abs=1e-3)  # reported as is
    assert sum(parts.values()) == pytest.approx(out["client_mean_ms"])


def test_lone_in_process_times_each_step_on_one_text() -> None:
    from seqcls_tools.bench import lone

    seen = []
    steps = {"tokenize": lambda batch: seen.append(batch) or [len(batch[0])], "decide": lambda ids: ids[0] * 2}
    runs = [lone.time_steps(steps, text) for text in ("ab", "cde", "f")]
    assert seen == [["ab"], ["cde"], ["f"]] and all(len(r) == 2 and min(r) >= 0 for r in runs)
    out = lone.summarize_steps(list(steps), runs)
    assert out["requests"] == 3 and set(out["steps_ms"]) == {"tokenize", "decide"}
    assert out["mean_ms"] == pytest.approx(sum(out["steps_ms"].values()), abs=1e-3)
    served = {"client_p50_ms": 3.0, "client_mean_ms": 4.0}
    assert lone.compare(served, {"p50_ms": 1.5, "mean_ms": 1.0}) == {"p50": 2.0, "mean": 4.0}


def test_conditions_line_names_every_flag_threads_batch_lengths_and_load() -> None:
    from seqcls_tools.bench import conditions

    results = {
        "meta": {
            "machine": {"cpu_model": "Some CPU 9000", "cpus": 2, "cpus_usable": 2, "isa": dict.fromkeys(FLAGS, False)},
            "clients": [1, 8],
            "texts_per_request": [1, 8],
        },
        "corpus": {"tokens": {"texts": 10, "min": 4, "median": 17, "p95": 40, "max": 52, "mean": 20.0}},
        "configs": {
            "fp32": {
                "options": {"model_instances": 1, "intra_op_threads": 2, "dynamic_batching": True, "max_batch_size": 64}
            }
        },
    }
    results["meta"]["machine"]["isa"]["avx2"] = True
    cond = conditions.sections(results)["serving"]
    line = conditions.line(cond)
    assert "CPU Some CPU 9000" in line and "2 usable CPUs" in line
    assert "avx2 yes" in line and all(f"{f} absent" in line for f in FLAGS if f != "avx2")
    assert "fp32 1×2" in line and "fp32 on ≤ 64" in line and "1/8 texts per request, 1/8 clients" in line
    assert "tokens min 4 / median 17 / p95 40 / max 52" in line and "load generator: Python gRPC client" in line


def _our_servers(root: Path) -> list[str]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if "tritonserver" in cmd and str(root) in cmd:
            found.append(cmd[:200])
    return found


@pytest.mark.slow
@pytest.mark.integration
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
        "conditions",
    } <= set(results)
    assert results["meta"]["mode"] == "quick" and results["meta"]["loadavg_start"]
    # bf16 exactly where the host multiplies bf16 (issue 40: it was left out even then)
    from seqcls.spec import host_refusal

    bf16 = host_refusal("bf16", providers=("CPUExecutionProvider",)) is None
    assert set(results["releases"]) == {"fp32", "fp32-fused", "int8", *(["bf16"] if bf16 else [])}
    assert results["meta"]["profiles"] == list(results["releases"])
    assert ("bf16" in results["meta"]["profiles_left_out"]) == (not bf16)
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
    # every profile at 1 client and at 8, and auto's recorded rate against the in-process limit, each a verdict
    for name in results["releases"]:
        assert {f"lone_vs_inprocess[{name}]", f"served_vs_inprocess[{name}]", f"auto_vs_inprocess[{name}]"} <= keys
    for name, entry in results["configs"].items():  # beside every lone request: an empty python model's, unloaded
        if entry.get("lone"):
            floor = entry["lone"]["floor"]
            assert floor["model"] == "seqcls.floor" and 0 < floor["p50_ms"] < entry["lone"]["served"]["client_p50_ms"]
            assert 0 < floor["ceiling"] < 1, (name, floor)
    gated = [p for p, r in results["releases"].items() if r["gate_passed"]]
    auto = results["auto"]
    assert set(auto["profiles"]) == set(gated) and auto["clients"] == 8, auto
    for e in auto["profiles"].values():  # auto's timing, run on the bench's releases: warmed, curves, 8 clients
        assert e["warm_lengths"] > 1 and e["single_sentences_per_s"] > 0 and e["concurrent_sentences_per_s"] > 0, e
        assert 2 <= len(e["passes_sentences_per_s"]) <= 4, e
    for r in results["ratios"]:
        if r["key"].startswith(("multi_text_vs_single[", "every_concurrency_vs_classic[")):
            assert r["value"] and r["baseline"] and r["ratio"] == round(r["value"] / r["baseline"], 2), r

    md = (out / "results.md").read_text()
    assert "| floor: an empty python model (p50) |" in md, "the lone tables print the floor"
    table = [line for line in md.splitlines() if line.startswith("| ")]
    for name in PROFILES:
        rows = [line for line in table if line.startswith(f"| {name} | tokenizer ")]
        assert len(rows) == (0 if results["configs"][name].get("skipped") else 6), name
    assert "## Ratios vs targets" in md
    _assert_roofline(results, md, proc.stdout)
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _assert_conditions(results, md)
    _assert_lone(results, md)


def _assert_roofline(results: dict, md: str, stdout: str) -> None:
    """The roofline (issue 40): measured host, the model's cost, a fraction for each served profile's rates."""
    roof = results["roofline"]
    assert roof["host"]["bandwidth_gb_s"] > 0 and roof["host"]["peaks"]["fp32"]["gflops"] > 0
    assert roof["model"]["gflops_per_text"] > 0 and roof["model"]["tokens"] == results["corpus"]["tokens"]["mean"]
    served = {n for n, e in results["configs"].items() if e.get("cells") and e.get("group") != "variant"}
    rows = roof["profiles"]
    assert {r["profile"] for r in rows} == served
    for name in served:
        where = {r["where"] for r in rows if r["profile"] == name}
        assert where == {"served, 8 clients", "served, 1 client", "in process"}, (name, where)
    for r in rows:
        assert r["texts_per_s"] > 0 and r["roofline_texts_per_s"] > 0 and r["fraction"] > 0, r
        assert r["fraction"] == pytest.approx(r["texts_per_s"] / r["roofline_texts_per_s"]), r
    section = md.split("## Roofline")[1].split("\n## ")[0]
    assert all(f"| {r['profile']} | {r['where']} | " in section for r in rows)
    assert "## Roofline" in stdout  # the console summary prints it too


def _assert_conditions(results: dict, md: str) -> None:
    """Every table of results.md sits under a conditions line naming this run's CPU, flags and text lengths."""
    machine = results["meta"]["machine"]
    assert set(FLAGS) <= set(machine["isa"]) and machine["cpu_model"]
    assert set(CONDITION_SECTIONS) <= set(results["conditions"])
    for name in CONDITION_SECTIONS:
        cond = results["conditions"][name]
        assert cond["cpu"] == machine["cpu_model"] and cond["flags"] == machine["isa"], name
        assert cond["threads"] and cond["batch"] and cond["request"] and cond["load"], name
        assert cond["loadavg"] == [results["meta"]["loadavg_start"], results["meta"]["loadavg_end"]], name
        texts = results["corpus"]["golden_tokens" if name in ("releases", "batch_dependence") else "tokens"]
        assert cond["texts"] == texts and 0 < texts["min"] <= texts["median"] <= texts["p95"] <= texts["max"], name
    assert "perf_analyzer" in results["conditions"]["head_to_head"]["load"]
    assert "1×2" in results["conditions"]["serving"]["threads"]  # fp32's default layout, from its options
    lines = md.splitlines()
    conditions_at = None
    for i, line in enumerate(lines):
        if line.startswith("## "):
            conditions_at = None
        elif line.startswith("*Conditions:*"):
            conditions_at = i
            assert f"CPU {machine['cpu_model']}" in line, line
            for flag, present in machine["isa"].items():
                assert f"{flag} {'yes' if present else 'absent'}" in line, (flag, line)
            assert "threads: " in line and "batch: " in line and "load generator: " in line, line
        elif line.startswith("|---"):
            assert conditions_at is not None, f"table without conditions: {lines[i - 1]}"
    tokens = results["corpus"]["tokens"]
    assert f"tokens min {tokens['min']} / median {tokens['median']} / p95 {tokens['p95']} / max {tokens['max']}" in md


def _assert_lone(results: dict, md: str) -> None:
    """Each main profile's lone request: parts from Triton's statistics, none negative, adding up to the
    client's latency; its section in results.md."""
    from seqcls_tools.bench.lone import REMAINDER

    lone_profiles = [n for n in PROFILES if not results["configs"][n].get("skipped")]
    requests = results["meta"]["budget"]["lone_requests"]
    for name in lone_profiles:
        lone = results["configs"][name]["lone"]
        served = lone["served"]
        assert served["requests"] == served["ensemble_requests"] == requests, name
        assert all(m["requests"] == requests for m in served["models"].values()), served["models"]
        parts = {p["part"]: p["ms"] for p in served["parts"]}
        assert list(parts)[:3] == ["tokenizer", "seqcls_model", "seqcls_postprocess"]
        assert min(parts["tokenizer"], parts["seqcls_model"], parts["seqcls_postprocess"]) > 0, parts
        # the models' own parts end before their responses are sent: no part overlaps another (lone.py)
        assert min(parts.values()) >= 0, (name, parts)
        assert sum(parts.values()) == pytest.approx(served["client_mean_ms"], rel=1e-3), (name, parts)
        assert served["ensemble_ms"] > 0 and served["remainder"]["hand_offs_ms"] > 0, served
        assert served["client_p50_ms"] > 0 and lone["inprocess"]["p50_ms"] > 0
        assert lone["served_over_inprocess"]["p50"] == round(served["client_p50_ms"] / lone["inprocess"]["p50_ms"], 2)
        assert set(lone["inprocess"]["steps_ms"]) == {"tokenize", "model", "decide"}
        assert lone["inprocess"]["requests"] == requests  # the same texts, in blocks between the served ones
    section = md.split("## A lone request, part by part")[1].split("\n## ")[0]
    for name in lone_profiles:
        assert f"### {name}\n" in section
    assert section.count(f"| {REMAINDER} |") == len(lone_profiles)
    assert section.count("| **served / in process** |") == len(lone_profiles)
