"""bf16 served through batch-invariant batching vs alone, against its single-text in-process rate.

The issue's bar: on a CPU with AVX512-BF16 or AMX, bf16 served at 8 clients ≥ 1.5x its own single-text
in-process rate, with 0 answers differing from alone. One run, interleaved rounds (the host is shared,
so slow drifts hit every cell alike), on the ERNIE 3.0 medium shape with random weights:

- served, 8 clients x 1 text, ``per-text``: ``batched`` (``SEQCLS_BF16_BATCHING=on``: rows of one bucket
  share OpenVINO runs after the engine's self-check) and ``alone`` (``off``: each text alone at its own
  length, bf16 as it was before batching and as it still serves on a CPU without AMX);
- in process, the served ONNX on ``seqcls_engine`` with the served thread count, ids only: each text
  alone at its own length (how bf16 ran before bucketing), alone in its bucket shape, and 8 at a time;
- answers: every corpus text through the batched server under 8 clients vs alone (one client).

Run: ``python -m seqcls_tools.bench.bf16_batching --work DIR [--quick]`` (DIR keeps the checkpoint).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.serving.repository import ServingOptions
from seqcls_tools.bench.plan import FULL, QUICK
from seqcls_tools.bench.profiles import bench_release, bench_settings, serve_release
from seqcls_tools.bench.serving import BenchServer, cell, warm_up

log = logging.getLogger("seqcls_tools.bench")
CLIENTS = 8
#: name → the engine's ``SEQCLS_BF16_BATCHING`` for that server (both ``per-text``, Triton's dynamic batcher on):
#: ``batched`` forces sharing on (after its self-check), ``alone`` is bf16 without it (each text at its own length)
SERVED = {"batched": "on", "alone": "off"}


def medium_checkpoint(work: Path, corpus: list[str]) -> Path:
    """The bench's ERNIE 3.0 medium shape under ``work`` (built once, kept for later runs)."""
    from seqcls_tools.bench.corpus import make_labels
    from seqcls_tools.bench.model import MEDIUM, build_checkpoint

    path = work / "checkpoint-medium"
    if not (path / "config.json").is_file():
        build_checkpoint(path, MEDIUM, corpus, make_labels(MEDIUM.num_labels), golden=corpus[:32])
    return path


class InProcess:
    """The served graph on ``seqcls_engine`` with the served thread count (ids only, no tokenizer): each text
    alone at its own length (bf16 not batching), alone in its bucket shape, and 8 at a time in bucket shapes."""

    def __init__(self, release, texts: list[str]) -> None:
        from seqcls.contract import shipped
        from seqcls.release.records import served_onnx, serving_tokenizer

        engine, self.text_mod = shipped.engine(), shipped.text()
        serving = serving_tokenizer(release)
        self.pad_id = serving.pad_id
        self.ids = self.text_mod.encode(serving.build(self.text_mod, release.config.max_length), texts)
        path, threads = served_onnx(release.workspace), ServingOptions().intra_op_threads
        self.bucketed = engine.session(path, "bf16", threads, pad_id=self.pad_id, batch=True)
        self.own = engine.session(path, "bf16", threads, pad_id=self.pad_id, batch=False)
        self.names = [i.name for i in self.bucketed.get_inputs()]

    def _block(self, session, size: int, seconds: float, start: int) -> tuple[int, float]:
        """Texts run and seconds taken: ``size`` texts per call from ``start`` on, for about ``seconds``."""
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            rows = [self.ids[(start + done + k) % len(self.ids)] for k in range(size)]
            session.run(None, self.text_mod.model_feeds(rows, self.names, strategy="longest", pad_id=self.pad_id))
            done += size
        return done, time.perf_counter() - t0

    def rates(self, seconds: float, block: float = 0.5) -> dict[str, float | None]:
        """Texts/s of each way, timed in alternating blocks of ``block`` s (the host's other load falls on all)."""
        ways = {"alone_own_length": (self.own, 1), "alone_bucket_shape": (self.bucketed, 1)}
        if self.bucketed.batching:
            ways["batched_8_bucket_shapes"] = (self.bucketed, 8)
        totals = dict.fromkeys(ways, (0, 0.0))
        for b in range(max(1, int(seconds / block / len(ways)))):
            for name, (session, size) in ways.items():
                texts, secs = self._block(session, size, block, start=b * 17)
                totals[name] = (totals[name][0] + texts, totals[name][1] + secs)
        out: dict[str, float | None] = {name: round(t / s, 2) for name, (t, s) in totals.items()}
        out.setdefault("batched_8_bucket_shapes", None)
        return out


def _answers(server, texts: list[str]) -> dict[str, Any]:
    """Every text alone (one client), then all of them again under 8 concurrent clients: equal bit for bit?"""
    from concurrent.futures import ThreadPoolExecutor

    import tritonclient.grpc as grpcclient

    from seqcls.steps.smoke import infer

    def client():
        return grpcclient.InferenceServerClient(url=server.config.grpc_url)

    one = client()
    alone = {t: infer(one, [t])[1] for t in texts}

    def ask(k: int) -> list[tuple[str, np.ndarray]]:
        mine = client()
        return [(t, infer(mine, [t])[1]) for t in texts[k::CLIENTS]]

    with ThreadPoolExecutor(CLIENTS) as pool:
        got = [row for rows in pool.map(ask, range(CLIENTS)) for row in rows]
    differing = [t for t, p in got if not np.array_equal(p, alone[t])]
    return {"texts": len(got), "differing": len(differing), "first": differing[0][:60] if differing else None}


def run(work: Path, quick: bool, rounds: int) -> dict[str, Any]:
    from seqcls.contract import shipped
    from seqcls.steps import run_release
    from seqcls_tools.bench.corpus import make_corpus
    from seqcls_tools.bench.machine import machine_facts

    engine = shipped.engine()
    budget = QUICK if quick else FULL
    texts = make_corpus(budget.corpus)
    checkpoint = medium_checkpoint(work, texts)
    home = work / "home"
    out: dict[str, Any] = {"machine": machine_facts(), "rounds": [], "clients": CLIENTS}
    cell_budget = replace(budget, cell_seconds=budget.h2h_seconds)
    with contextlib.ExitStack() as stack:
        servers, release = {}, None
        for i, (name, batching) in enumerate(SERVED.items()):
            os.environ[engine.BATCHING_ENV] = batching  # the server started now inherits it (and this process)
            server = stack.enter_context(BenchServer(work, 300 + i, keep=False, state=f"state-bf16-{i}"))
            release = bench_release(checkpoint, "bf16", bench_settings(home, server))
            for _ in run_release(release, until="evaluate"):  # done once: the workspace is shared
                pass
            serve_release(release, ServingOptions(batching="per-text"))
            warm_up(server, texts, budget)
            servers[name] = server
        out["parity_batch_invariance"] = _parity(release)
        inprocess = InProcess(release, texts)
        out["engine_self_check"] = inprocess.bucketed.self_check
        offset = 0
        for r in range(rounds):
            entry: dict[str, Any] = {"round": r}
            for name, server in servers.items():
                result = cell(server, texts, CLIENTS, 1, cell_budget, offset)
                offset += result["texts"] + 3
                entry[f"served_{name}_8c"] = result["sentences_per_s"]
                entry[f"served_{name}_batch"] = result.get("triton_batch")
            entry["inprocess"] = inprocess.rates(budget.inprocess_seconds * 6)
            out["rounds"].append(entry)
            log.info("bench: bf16 batching round %d: %s", r + 1, json.dumps(entry, default=str)[:600])
        out["answers"] = _answers(servers["batched"], texts[: 64 if quick else 400])
    _summarise(out)
    return out


def _parity(release) -> dict[str, Any]:
    from seqcls.release.records import ParityReport

    report = ParityReport.load(release.workspace).batch_invariance
    return {k: report.get(k) for k in ("passed", "serving", "rows_compared", "rows_differing", "compositions", "why")}


def _summarise(out: dict[str, Any]) -> None:
    def median(key: str, inner: str | None = None) -> float | None:
        values = [(e[key] if inner is None else e[key][inner]) for e in out["rounds"]]
        values = [v for v in values if v is not None]
        return round(float(np.median(values)), 2) if values else None

    s = {
        "served_batched_8c": median("served_batched_8c"),
        "served_alone_8c": median("served_alone_8c"),
        "inprocess_alone_own_length": median("inprocess", "alone_own_length"),
        "inprocess_alone_bucket_shape": median("inprocess", "alone_bucket_shape"),
        "inprocess_batched_8": median("inprocess", "batched_8_bucket_shapes"),
    }
    base = s["inprocess_alone_own_length"]
    s["served_batched_vs_inprocess_single"] = round(s["served_batched_8c"] / base, 2) if base else None
    s["served_alone_vs_inprocess_single"] = round(s["served_alone_8c"] / base, 2) if base else None
    out["summary"] = s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="directory for the checkpoint, releases, servers")
    parser.add_argument("--quick", action="store_true", help="the bench's --quick budget")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the results (JSON) here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    out = run(args.work, args.quick, args.rounds)
    text = json.dumps(out, indent=1, default=str)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    log.info("bench: bf16 batching summary %s", json.dumps(out["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
