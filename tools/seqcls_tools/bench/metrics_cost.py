"""What the serving models' seqcls_* metrics cost: served rate with them on vs off, and memory per series.

Two local Tritons serve the same trained checkpoint, one published with the metrics (the default)
and one with ``SEQCLS_SERVING_METRICS=off``; perf_analyzer (Triton's load generator) drives one at a
time, in interleaved rounds (on, off, off, on, ...) so the machine's drift hits both alike, and the
ratio of the medians is printed. Memory: the server process's RSS with and without the series after
the same traffic, over the number of seqcls_* series it exports.

    python -m seqcls_tools.bench.metrics_cost [--checkpoint DIR] [--rounds 4] [--seconds 4]

Without ``--checkpoint`` the quick demo model is trained first (~35 s on two cores).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from seqcls.config import ReleaseConfig
from seqcls.localtriton import LocalTriton, TritonServerConfig, free_ports
from seqcls.release.intake import open_release
from seqcls.serving import metrics as triton_metrics
from seqcls.settings import Settings
from seqcls.steps import run_release
from seqcls_tools.bench import machine, measure, perf_analyzer

log = logging.getLogger("seqcls.bench.metrics_cost")
DEMO_DATA = Path(__file__).resolve().parents[1] / "demo" / "data"


def _server(root: Path, name: str, ports: tuple[int, int, int], metrics_on: bool) -> tuple[Settings, LocalTriton]:
    http, grpc, metrics_port = ports
    settings = Settings.from_env(
        home=root / name,
        triton_grpc=f"127.0.0.1:{grpc}",
        triton_http=f"127.0.0.1:{http}",
        triton_metrics=f"127.0.0.1:{metrics_port}",
        mlflow_tracking_uri=f"sqlite:///{root / name / 'mlflow.db'}",
    )
    settings = replace(settings, serving_metrics=metrics_on)
    server = LocalTriton(TritonServerConfig.from_settings(settings, metrics_port=metrics_port))
    server.start()
    return settings, server


def _rss_mb(server: LocalTriton) -> float:
    snap = measure.ProcessSnapshot.take(server.status().pid)
    return sum(v for pid, v in snap.rss.items() if snap.roles.get(pid) == "server") / 1e6


def run(checkpoint: Path, rounds: int, seconds: float, clients: tuple[int, ...]) -> dict[str, Any]:
    binary = perf_analyzer.find_binary()
    if binary is None:
        raise SystemExit("perf_analyzer is not installed: run `make setup-perf` first")
    texts = [json.loads(line)["text"] for line in (DEMO_DATA / "test.jsonl").read_text(encoding="utf-8").splitlines()]
    with tempfile.TemporaryDirectory(prefix="seqcls-metrics-cost-") as tmp:
        root = Path(tmp)
        servers: dict[str, tuple[Settings, LocalTriton]] = {}
        try:
            for mode in ("on", "off"):
                t0 = time.perf_counter()
                servers[mode] = _server(root, mode, tuple(free_ports(3)), mode == "on")
                run_release(
                    open_release(checkpoint, ReleaseConfig(eval_set=str(DEMO_DATA / "test.jsonl")), servers[mode][0])
                )
                log.info("metrics %s: released in %.0fs", mode, time.perf_counter() - t0)
            data = {n: perf_analyzer.input_data(texts, root / f"texts-{n}.json", n) for n in clients}
            cells: dict[tuple[str, int], list[float]] = {}
            cpu_ms: dict[tuple[str, int], list[float]] = {}  # server + stubs + load generator, per text
            for r in range(rounds):
                order = ("on", "off") if r % 2 == 0 else ("off", "on")
                for n in clients:
                    for mode in order:
                        cell = perf_analyzer.pa_cell(binary, servers[mode][1], n, seconds, data[n], root)
                        if "error" in cell:
                            raise RuntimeError(f"perf_analyzer failed (metrics {mode}, {n} clients): {cell['error']}")
                        rate, cpu = cell["sentences_per_s"], cell["cpu_ms_per_sentence"]
                        cells.setdefault((mode, n), []).append(rate)
                        cpu_ms.setdefault((mode, n), []).append(cpu)
                        log.info(
                            "round %d, %d clients, metrics %s: %.1f texts/s, %.2f CPU ms/text",
                            r + 1,
                            n,
                            mode,
                            rate,
                            cpu,
                        )
            samples = triton_metrics.scrape(servers["on"][1].config.metrics_url)
            series = sum(1 for s in samples if s.name.startswith("seqcls_"))
            rss = {mode: _rss_mb(servers[mode][1]) for mode in ("on", "off")}
        finally:
            for _, server in servers.values():
                server.stop()
    result: dict[str, Any] = {"machine": machine.machine_facts(), "cells": {}}
    for n in clients:
        on, off = statistics.median(cells[("on", n)]), statistics.median(cells[("off", n)])
        cpu_on, cpu_off = statistics.median(cpu_ms[("on", n)]), statistics.median(cpu_ms[("off", n)])
        result["cells"][n] = {
            "on": round(on, 1),
            "off": round(off, 1),
            "ratio": round(on / off, 3),
            "cpu_ms_on": round(cpu_on, 3),
            "cpu_ms_off": round(cpu_off, 3),
            "cpu_ratio": round(cpu_on / cpu_off, 3),
            "rounds_on": cells[("on", n)],
            "rounds_off": cells[("off", n)],
        }
    result["series"] = series
    result["server_rss_mb"] = {k: round(v, 1) for k, v in rss.items()}
    result["rss_kb_per_series"] = round((rss["on"] - rss["off"]) * 1000 / max(series, 1), 2)
    return result


def report(result: dict[str, Any]) -> str:
    lines = [
        "metrics on vs off: served texts/s and CPU ms per text (Triton + stubs + perf_analyzer), 1 text per "
        "request, medians of interleaved rounds"
    ]
    lines.append(f"{'clients':>8} {'on':>8} {'off':>8} {'on/off':>7} {'cpu on':>8} {'cpu off':>8} {'on/off':>7}")
    for n, c in result["cells"].items():
        lines.append(
            f"{n:>8} {c['on']:>8.1f} {c['off']:>8.1f} {c['ratio']:>7.3f} {c['cpu_ms_on']:>8.2f} "
            f"{c['cpu_ms_off']:>8.2f} {c['cpu_ratio']:>7.3f}"
        )
    lines.append(
        f"seqcls_* series exported: {result['series']}; server RSS on {result['server_rss_mb']['on']} MB, off "
        f"{result['server_rss_mb']['off']} MB -> {result['rss_kb_per_series']} kB per series (RSS noise included)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a trained checkpoint (default: train the quick demo model)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0, help="perf_analyzer's measurement window")
    parser.add_argument("--clients", default="1,8")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from seqcls_tools.demo.train import checkpoint_or_quick_demo

    checkpoint = checkpoint_or_quick_demo(args.checkpoint, Path(tempfile.mkdtemp(prefix="seqcls-demo-")))
    clients = tuple(int(c) for c in args.clients.split(","))
    result = run(checkpoint, args.rounds, args.seconds, clients)
    print(report(result))
    print(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
