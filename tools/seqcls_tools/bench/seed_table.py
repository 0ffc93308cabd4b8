"""The second seed's table, reproduced on this CPU: a DeBERTa-v2 classifier served by PyTorch
directly, by Triton without dynamic batching and with it — P95, QPS and memory, 8 clients,
len-128 texts — printed next to the seed's A10 figures.

What differs from the seed, stated in the output too: a CPU (2 cores here) instead of an A10; a
randomly initialised DeBERTa-v2 of the base shape by default (12 layers, hidden 768, Chinese
WordPiece vocabulary padded to 21,128 — the seed's ``nlp_deberta_rex-uninlu_chinese-base`` cannot
be downloaded here) with a 7-label multi-label head instead of the seed's NER head; Triton runs
seqcls's ensemble (tokenizer → ONNX Runtime in the python backend → postprocess), released
through the same gates (``seqcls release`` up to validate, then the serving steps), not a
TorchScript trace with the tokenizer baked in; memory is resident memory (process RSS), not GPU
memory; the load generator's Python client threads share the 2 cores with the server.

    .venv/bin/python -m seqcls_tools.bench.seed_table [--layers 12] [--seconds 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("seqcls_tools.bench.seed_table")

#: The seed's A10 figures (input length 128, batch 8): P95 ms, QPS, GPU memory GB.
SEED = {
    "pytorch-direct": {"p95_ms": 210, "qps": 38, "memory_gb": 3.4, "what": "Gradio + PyTorch directly"},
    "triton-no-batching": {"p95_ms": 185, "qps": 43, "memory_gb": 3.1, "what": "Triton, no dynamic batching"},
    "triton-dynamic-batching": {"p95_ms": 132, "qps": 61, "memory_gb": 3.1, "what": "Triton, dynamic batching"},
}
LABELS = ("组织关系", "组织关系##裁员", "组织关系##加盟", "财经", "财经##融资", "体育", "体育##夺冠")
MAX_LENGTH = 128


def texts_of_128_tokens(n: int, seed: int = 0) -> list[str]:
    """Chinese texts long enough that every one tokenizes to exactly ``MAX_LENGTH`` tokens."""
    from seqcls_tools.bench.corpus import _zh

    rng = random.Random(seed)
    return [_zh(rng, 180) for _ in range(n)]


def build_checkpoint(work: Path, *, layers: int, hidden: int, texts: list[str]) -> Path:
    from seqcls_tools.testing_hf import build_tiny_hf_checkpoint

    target = work / f"deberta-v2-L{layers}-H{hidden}"
    if (target / "SEQCLS_DONE.json").is_file():
        return target
    return build_tiny_hf_checkpoint(
        target,
        architecture="deberta-v2",
        labels=LABELS,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=max(1, hidden // 64),
        max_position=512,
        corpus=texts,
        golden=texts[:24],
        logit_scale=20.0,
        vocab_size=21128,
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def _summary(latencies_ms: list[float], texts: int, seconds: float, failed: int, memory_mb: float) -> dict[str, Any]:
    return {
        "requests": len(latencies_ms) + failed,
        "failed": failed,
        "qps": round(texts / seconds, 2) if seconds else 0.0,
        "p50_ms": round(_percentile(latencies_ms, 50), 1),
        "p95_ms": round(_percentile(latencies_ms, 95), 1),
        "mean_ms": round(statistics.fmean(latencies_ms), 1) if latencies_ms else None,
        "memory_mb": round(memory_mb, 1),
        "seconds": round(seconds, 1),
    }


def pytorch_direct(checkpoint: Path, texts: list[str], *, clients: int, seconds: float) -> dict[str, Any]:
    """The seed's first row: 8 client threads call tokenizer + eager model in one Python process."""
    import psutil
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(2)
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoint)).eval()
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    lock, issued = threading.Lock(), [0]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    deadline = [0.0]
    barrier = threading.Barrier(clients + 1)

    def worker(k: int) -> None:
        barrier.wait()
        while time.perf_counter() < deadline[0]:
            with lock:
                i = issued[0]
                issued[0] += 1
            t0 = time.perf_counter()
            enc = tok(texts[i % len(texts)], truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            with torch.inference_mode():
                torch.sigmoid(model(**enc).logits)
            latencies[k].append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    deadline[0] = t0 + seconds
    barrier.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = [x for per in latencies for x in per]
    out = _summary(lat, len(lat), wall, 0, (proc.memory_info().rss - rss0) / 1e6)
    out["memory_note"] = "RSS added by loading the model and serving (this process)"
    return out


def _rss_mb(pid: int) -> float:
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 1e6


def triton_cell(release, work: Path, index: int, options, texts: list[str], *, clients: int, seconds: float) -> dict:
    """The release served on a fresh local Triton with ``options``; the same load as the seed's."""
    from dataclasses import replace

    from seqcls_tools.bench.measure import run_load, self_cpu
    from seqcls_tools.bench.profiles import bench_settings, serve_release
    from seqcls_tools.bench.serving import BenchServer

    with BenchServer(work, index, keep=False) as server:
        settings = bench_settings(Path(release.settings.home), server)
        served = replace(release, settings=settings)
        t0 = time.perf_counter()
        serve_release(served, options)
        bring_up = time.perf_counter() - t0
        run_load(server.config.grpc_url, texts, clients=clients, texts_per_request=1, max_requests=16, max_seconds=30)
        cpu0 = self_cpu()
        load = run_load(
            server.config.grpc_url, texts, clients=clients, texts_per_request=1, max_requests=10**6, max_seconds=seconds
        )
        client_cores = (self_cpu() - cpu0) / load.seconds
        out = _summary(load.latencies_ms, load.texts, load.seconds, load.failed, _rss_mb(server.status().pid))
        out.update(
            bring_up_s=round(bring_up, 1),
            client_cores=round(client_cores, 2),
            memory_note="RSS of tritonserver + its python-backend stubs",
            errors=load.errors[:2],
        )
        return out


def _gated(checkpoint: Path, work: Path, profile: str):
    """The release of ``profile`` through export → convert → validate (its own workspace)."""
    from seqcls.config import ReleaseConfig
    from seqcls.steps import run_release
    from seqcls.workspace import open_release
    from seqcls_tools.bench.profiles import bench_settings

    release = open_release(
        checkpoint, ReleaseConfig(max_length=MAX_LENGTH, profile=profile), bench_settings(work / f"home-{profile}")
    )
    steps = {r.step: round(r.seconds, 1) for r in run_release(release, until="validate")}
    return release, steps


def run(
    work: Path, *, layers: int, hidden: int, clients: int, seconds: float, profiles: tuple[str, ...] = ()
) -> dict[str, Any]:
    from seqcls.config import ReleaseConfig
    from seqcls.serving.repository import ServingOptions
    from seqcls.steps import run_release
    from seqcls.steps.validate import serving_ids
    from seqcls.workspace import open_release
    from seqcls_tools.bench.profiles import bench_settings

    texts = texts_of_128_tokens(400)
    t0 = time.perf_counter()
    checkpoint = build_checkpoint(work, layers=layers, hidden=hidden, texts=texts)
    built = time.perf_counter() - t0
    release = open_release(checkpoint, ReleaseConfig(max_length=MAX_LENGTH), bench_settings(work / "home"))
    t0 = time.perf_counter()
    steps = {r.step: round(r.seconds, 1) for r in run_release(release, until="validate")}
    gated = time.perf_counter() - t0
    ids = [len(x) for x in serving_ids(release, texts[:50])]
    assert set(ids) == {MAX_LENGTH}, f"texts are not all {MAX_LENGTH} tokens: {sorted(set(ids))}"
    cells: dict[str, Any] = {}
    log.info("seed table: PyTorch direct, %d clients, %.0f s", clients, seconds)
    cells["pytorch-direct"] = pytorch_direct(checkpoint, texts, clients=clients, seconds=seconds)
    base = ServingOptions.for_device("cpu")
    triton_options = {
        "triton-no-batching": (ServingOptions(dynamic_batching=False), "no dynamic batching: one request per run"),
        "triton-dynamic-batching": (
            ServingOptions(dynamic_batching=True, batching="pad-to-longest", max_queue_delay_us=1000),
            "dynamic batching, requests merged into one ONNX Runtime run (1 ms queue delay, as the seed)",
        ),
        "triton-seqcls-default": (base, "seqcls's CPU default: dynamic batching, every text at its own length"),
    }
    for i, (name, (options, what)) in enumerate(triton_options.items()):
        log.info("seed table: %s (%s), %d clients, %.0f s", name, what, clients, seconds)
        cells[name] = triton_cell(release, work, i, options, texts, clients=clients, seconds=seconds)
        cells[name]["what"] = what
    gates: dict[str, Any] = {"fp32": steps}
    for j, profile in enumerate(profiles):  # the same model through the other serving profiles
        name = f"triton-seqcls-default-{profile}"
        log.info("seed table: %s, %d clients, %.0f s", name, clients, seconds)
        try:
            released, gates[profile] = _gated(checkpoint, work, profile)
        except Exception as exc:  # a profile's gate failing is a result, not a crash
            cells[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            continue
        cells[name] = triton_cell(
            released, work, len(triton_options) + j, base, texts, clients=clients, seconds=seconds
        )
        cells[name]["what"] = f"seqcls's CPU default, profile {profile}"
    return {
        "model": {
            "architecture": "DebertaV2ForSequenceClassification",
            "layers": layers,
            "hidden": hidden,
            "parameters": release.workspace.step("export")["summary"]["parameters"],
            "max_length": MAX_LENGTH,
        },
        "build_s": round(built, 1),
        "gate_s": round(gated, 1),
        "steps_s": gates,
        "clients": clients,
        "seconds_per_cell": seconds,
        "cells": cells,
        "seed_a10": SEED,
    }


def table(results: dict[str, Any]) -> str:
    rows = [
        "| configuration | P95 ms (here) | QPS (here) | memory (here) "
        "| P95 ms (seed, A10) | QPS (seed) | memory (seed, GPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, cell in results["cells"].items():
        if "error" in cell:
            rows.append(f"| {name} | failed: {cell['error'][:120]} | | | | | |")
            continue
        seed = SEED.get(name, {})
        rows.append(
            f"| {name} | {cell['p95_ms']} | {cell['qps']} | {cell['memory_mb'] / 1000:.2f} GB RSS | "
            f"{seed.get('p95_ms', '—')} | {seed.get('qps', '—')} | {seed.get('memory_gb', '—')}"
            f"{' GB' if seed else ''} |"
        )
    cells = results["cells"]
    ratio = cells["triton-dynamic-batching"]["qps"] / max(cells["triton-no-batching"]["qps"], 1e-9)
    direct = cells["triton-dynamic-batching"]["qps"] / max(cells["pytorch-direct"]["qps"], 1e-9)
    rows += [
        "",
        f"dynamic batching / no batching QPS: {ratio:.2f}x here, {61 / 43:.2f}x in the seed; "
        f"Triton dynamic batching / PyTorch direct: {direct:.2f}x here, {61 / 38:.2f}x in the seed",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--work", type=Path, default=Path("var/bench/seed-table"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profiles", nargs="*", default=["fp32-fused", "int8"], help="other serving profiles served")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    results = run(
        args.work.resolve(),
        layers=args.layers,
        hidden=args.hidden,
        clients=args.clients,
        seconds=args.seconds,
        profiles=tuple(args.profiles),
    )
    out = args.out or args.work / "seed-table.json"
    out.write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    print(table(results))
    print(f"\nfull results: {out}")


if __name__ == "__main__":
    main()
