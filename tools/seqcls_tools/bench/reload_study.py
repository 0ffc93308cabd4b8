"""How long a hot reload of the ERNIE-3.0-medium-shaped model takes, idle and under load, phase by phase.

One medium checkpoint (built once, reused from ``--work``), released to the validate gate once;
then three serving versions of it (thresholds 0.5, 0.55, 0.6: the same 302 MB ONNX, each its own
Triton version N) go through the serving steps (publish, reload, smoke, expose) on one local Triton:

1. the first version: the server's cold start (not the figure asked about);
2. the second: a hot reload with the server idle;
3. the third: a hot reload while ``--clients`` clients (8) keep sending single-text requests to
   ``seqcls`` (unpinned) — every failed request is counted.

Printed per release: each step's seconds and every ``loaded <model> in N s`` the client logged (the
per-model load times, at the second of the switch each one ended); last a ``RESULT`` line. Every
figure comes from this one run (exit 1 if a request failed)::

    .venv/bin/python -m seqcls_tools.bench.reload_study --work /tmp/seqcls-reload-study
    .venv/bin/python -m seqcls_tools.bench.reload_study --model-instances 2   # the 2 x 1-thread layout
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

THRESHOLDS = (0.5, 0.55, 0.6)


def checkpoint(work: Path) -> Path:
    from seqcls_tools.bench.corpus import make_corpus, make_labels
    from seqcls_tools.bench.model import MEDIUM, build_checkpoint

    path = work / f"checkpoint-{MEDIUM.name}"
    if not (path / "bench_model.json").is_file():
        corpus = make_corpus(2000, seed=0)
        build_checkpoint(path, MEDIUM, corpus, make_labels(MEDIUM.num_labels), golden=corpus[-32:], seed=0)
    return path


def release_for(ckpt: Path, threshold: float, settings):
    from seqcls.config import ReleaseConfig
    from seqcls.workspace import open_release

    return open_release(ckpt, ReleaseConfig(threshold=threshold), settings)


def serve(release, options) -> dict[str, Any]:
    """The serving steps on ``release``, each timed, with every model load the client logged."""
    from seqcls.serving import control
    from seqcls.steps import step
    from seqcls_tools.bench.profiles import serving_steps
    from seqcls_tools.bench.reload import load_log

    out: dict[str, Any] = {"steps": {}}
    t0 = time.perf_counter()
    try:
        with load_log() as loads:
            for name in serving_steps():
                fn = step(name).load()
                t = time.perf_counter()
                fn(release, **({"options": options} if "options" in inspect.signature(fn).parameters else {}))
                out["steps"][name] = round(time.perf_counter() - t, 2)
    finally:
        repository = Path(str(release.settings.triton_repository))
        control.give_lease(repository, release.config.model_name, control.release_owner(release))
    out["total"] = round(time.perf_counter() - t0, 2)
    out["loads"] = loads.loads
    return out


def under_load(url: str, texts: list[str], clients: int, fn) -> tuple[Any, Any]:
    from seqcls_tools.bench import measure

    stop = threading.Event()
    box: dict[str, Any] = {}

    def load() -> None:
        box["r"] = measure.run_load(
            url, texts, clients=clients, texts_per_request=1, max_requests=10**9, max_seconds=600, stop=stop
        )

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        time.sleep(2.0)
        result = fn()
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join()
    return result, box["r"]


def show(label: str, entry: dict[str, Any]) -> None:
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in entry["steps"].items())
    print(f"{label}: total {entry['total']:.1f}s — {steps}")
    for at, model, secs in entry["loads"]:
        print(f"    t={at:6.2f}s  loaded {model:<20} in {secs:5.1f}s")
    if "load" in entry:
        ld = entry["load"]
        print(f"    under load: {ld['requests']} requests, {ld['failed']} failed, p95 {ld.get('p95_ms')} ms")


def _server(work: Path, extra_args: tuple[str, ...]):
    import shutil

    from seqcls.localtriton import LocalTriton, TritonServerConfig, free_ports

    http, grpc, metrics = free_ports(3)
    repo = work / "triton-repo"
    shutil.rmtree(repo, ignore_errors=True)
    cfg = TritonServerConfig(
        repository=repo,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        state_dir=work / "triton-state",
        extra_args=extra_args,
    )
    return LocalTriton(cfg)


def study(server, releases: list, options, texts: list[str], clients: int) -> dict[str, Any]:
    """Cold start, idle hot reload, hot reload under ``clients`` clients: one entry each."""
    results: dict[str, Any] = {"loadavg_start": os.getloadavg()[0]}
    results["first"] = serve(releases[0], options)
    show("first release (cold)", results["first"])
    time.sleep(2.0)
    results["idle"] = serve(releases[1], options)
    show("hot reload, idle", results["idle"])
    time.sleep(2.0)
    url = server.config.grpc_url
    entry, load = under_load(url, texts, clients, lambda: serve(releases[2], options))
    entry["load"] = {**load.summary(), "errors": load.errors[:3]}
    results["loaded"] = entry
    show(f"hot reload, {clients} clients", entry)
    results["loadavg_end"] = os.getloadavg()[0]
    return results


def main(argv: list[str] | None = None) -> int:
    from seqcls.serving.repository import ServingOptions
    from seqcls.settings import Settings
    from seqcls.steps import run_release
    from seqcls_tools.bench.corpus import make_corpus

    p = argparse.ArgumentParser(prog="python -m seqcls_tools.bench.reload_study", description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/seqcls-reload-study"), help="kept and reused")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--model-instances", type=int, default=1, help="seqcls_model instances (intra-op threads 2/n)")
    p.add_argument("--json", type=Path)
    p.add_argument("--triton-arg", action="append", default=[], help="extra tritonserver flag (A/B trials)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    for name in ("seqcls", "seqcls_tools"):
        logging.getLogger(name).setLevel(logging.INFO)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ckpt = checkpoint(args.work)
    server = _server(args.work, tuple(args.triton_arg))
    cfg = server.config
    settings = Settings(
        home=args.work / "home",
        triton_repository=cfg.repository,
        triton_grpc=(cfg.grpc_url,),
        triton_http=(cfg.http_url,),
    )
    releases = [release_for(ckpt, th, settings) for th in THRESHOLDS]
    for rel in releases:
        list(run_release(rel, until="validate"))
    print(f"checkpoint + validated releases ready in {time.perf_counter() - t0:.0f}s")
    n = max(1, args.model_instances)
    options = ServingOptions(model_instances=n, intra_op_threads=max(1, 2 // n))
    server.start()
    try:
        results = study(server, releases, options, make_corpus(2000, seed=0)[64:1064], args.clients)
    finally:
        server.stop()
    idle, loaded = results["idle"], results["loaded"]
    print(
        f"RESULT model instances {n}: reload idle {idle['steps']['reload']:.1f}s (serving steps {idle['total']:.1f}s); "
        f"under {args.clients} clients {loaded['steps']['reload']:.1f}s (serving steps {loaded['total']:.1f}s), "
        f"{loaded['load']['failed']} failed of {loaded['load']['requests']}; "
        f"loadavg {results['loadavg_start']:.1f}→{results['loadavg_end']:.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0 if loaded["load"]["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
