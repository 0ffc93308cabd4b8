"""The second seed's table on a trained checkpoint: speed and memory of each serving configuration
beside the labeled micro/macro-F1 of what that configuration answered.

The seed compares serving with and without dynamic batching (P95, QPS, memory) on an A10; what it
cannot say is whether a faster configuration still answers right. This table measures both on one
trained model and its labeled eval set (by default the demo model and its held-out test texts):

- **framework directly**: the framework's own inference in this process, loaded once — Paddle
  Inference on the exported static graph (ERNIE) or PyTorch eager (Hugging Face) with the
  framework's tokenizer — one worker thread answering the clients' requests in arrival order, as
  the seed's Gradio app does by default;
- **Triton, no dynamic batching** and **Triton, dynamic batching** (requests merged, padded to the
  longest, 1 ms queue delay): the seed's two server rows, fp32;
- **seqcls's CPU default** for each profile (``fp32``, ``fp32-fused``, ``int8``, and ``bf16`` on a CPU with
  AVX512-BF16 or AMX: left out, with the reason, elsewhere).

Every Triton row is a release of the checkpoint through the real gates (export → convert →
validate), served on a fresh local Triton by the library's serving steps (publish → reload →
smoke → expose). Its labeled scores come from its own answers: each eval text sent alone through
the public route; the offline quality gate's score of the same published graph
(:func:`seqcls.gates.scoring.predict`) is printed beside it, with how many texts' label sets
differ between the two. Then ``clients`` threads send single eval texts back to back for
``seconds``: P95, QPS, and the resident memory of Triton and its python stubs. ::

    .venv/bin/python -m seqcls_tools.bench.seed_table [--checkpoint DIR --eval-set FILE] [--seconds 30]

Without ``--checkpoint`` the quick demo model is trained first (about a minute on two cores).
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.serving.repository import ServingOptions
from seqcls_tools.bench import conditions, machine, measure
from seqcls_tools.bench.tokens import token_distribution

log = logging.getLogger("seqcls_tools.bench.seed_table")

DEMO_TEST_SET = Path(__file__).resolve().parents[1] / "demo" / "data" / "test.jsonl"
FRAMEWORK = "framework directly"
#: The classic server row (Triton, one request per run): the "× classic" column's reference.
CLASSIC_ROW = "Triton, no dynamic batching"
#: The exact seqcls row: the reference of a reduced-precision row's labeled drop.
FP32_ROW = "seqcls fp32"
#: The seed's A10 figures (input length 128, batch 8): P95 ms, QPS, GPU memory GB.
SEED = {
    FRAMEWORK: (210, 38, 3.4),
    "Triton, no dynamic batching": (185, 43, 3.1),
    "Triton, dynamic batching": (132, 61, 3.1),
}


@dataclass(frozen=True)
class Row:
    """One Triton configuration of the table: which release, served how."""

    name: str
    profile: str
    options: ServingOptions
    what: str


ROWS = (
    Row(
        CLASSIC_ROW,
        "fp32",
        ServingOptions(dynamic_batching=False),
        "fp32, one request per ONNX Runtime run",
    ),
    Row(
        "Triton, dynamic batching",
        "fp32",
        ServingOptions(dynamic_batching=True, batching="pad-to-longest", max_queue_delay_us=1000),
        "fp32, requests merged into one run, padded to the longest (1 ms queue delay, as the seed)",
    ),
    Row(FP32_ROW, "fp32", ServingOptions(), "seqcls's CPU default: every text at its own length"),
    Row("seqcls fp32-fused", "fp32-fused", ServingOptions(), "the same, ORT's transformer fusions"),
    Row("seqcls int8", "int8", ServingOptions(), "the same, int8 dynamic quantisation"),
    Row("seqcls bf16", "bf16", ServingOptions(), "the same, fp32's graph on OpenVINO at bf16 (AVX512-BF16 / AMX)"),
)


def host_rows() -> tuple[tuple[Row, ...], dict[str, str]]:
    """The rows this host can serve, and why the others are left out (bf16 without a bf16 CPU)."""
    from seqcls.spec import host_refusal

    rows, skipped = [], {}
    for row in ROWS:
        refusal = host_refusal(row.profile, providers=("CPUExecutionProvider",), runtime=row.options.runtime)
        if refusal:
            skipped[row.name] = refusal
            log.warning("seed table: %s left out: %s", row.name, refusal)
        else:
            rows.append(row)
    return tuple(rows), skipped


def _summary(latencies_ms: Sequence[float], texts: int, seconds: float, failed: int) -> dict[str, Any]:
    return {
        "requests": len(latencies_ms) + failed,
        "failed": failed,
        "qps": round(texts / seconds, 2) if seconds > 0 else 0.0,
        **measure.percentiles(latencies_ms),
        "seconds": round(seconds, 2),
    }


# ----------------------------------------------------------------------------- scores


def _scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], labels: Sequence[str]) -> dict[str, Any]:
    from seqcls.gates.metrics import score

    s = score(gold, pred, labels)
    return {"micro_f1": round(s.micro_f1, 4), "macro_f1": round(s.macro_f1, 4), "texts": s.texts}


def _differing(a: Sequence[Sequence[str]], b: Sequence[Sequence[str]]) -> int:
    return sum(set(x) != set(y) for x, y in zip(a, b, strict=True))


def served_answers(ops, texts: Sequence[str]) -> list[list[str]]:
    """Each text alone through the public route, as a client would send it: its label set."""
    out = []
    for text in texts:
        preds, _ = ops.infer([text])
        out.append([p["label"] for p in preds[0]])
    return out


# ----------------------------------------------------------------------------- the framework row


class _Framework:
    """The checkpoint's framework, loaded once: ``tokenize`` per text, ``logits`` per batch of ids."""

    def __init__(self, release) -> None:
        from seqcls.frameworks import for_checkpoint
        from seqcls.release.records import model_inputs, serving_tokenizer, static_dir

        ckpt = release.checkpoint
        self.max_length = release.config.max_length
        self.kind = type(for_checkpoint(ckpt)).__name__
        if self.kind == "Paddle":
            from paddlenlp.transformers import AutoTokenizer

            from seqcls.frameworks.paddle import paddle_predictor

            self.predictor = paddle_predictor(static_dir(release.workspace))
            self.tokenizer = AutoTokenizer.from_pretrained(str(ckpt.path))
            self.what = "Paddle Inference (the exported static graph) + PaddleNLP's tokenizer"
        else:
            import torch
            from transformers import AutoTokenizer

            from seqcls.frameworks.transformers import load_model

            torch.set_num_threads(2)
            self.model, _ = load_model(ckpt)
            self.tokenizer = AutoTokenizer.from_pretrained(str(ckpt.path))
            self.input_names = list(model_inputs(release.workspace))
            self.pad_id = serving_tokenizer(release).pad_id
            self.what = "PyTorch eager + the checkpoint's Hugging Face tokenizer"

    def tokenize(self, text: str) -> list[int]:
        enc = self.tokenizer([text], max_length=self.max_length, truncation=True, padding=False)
        return [int(x) for x in enc["input_ids"][0]]

    def logits(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        if self.kind == "Paddle":
            from seqcls.frameworks.paddle import predictor_logits

            return predictor_logits(self.predictor, ids)
        from seqcls.frameworks.transformers import eager_logits

        return eager_logits(self.model, ids, self.input_names, self.pad_id)


def framework_direct(
    release, graph, texts: Sequence[str], gold: Sequence[Sequence[str]], *, clients: int, seconds: float
) -> dict[str, Any]:
    """The seed's first row: ``clients`` threads queue single texts for one worker that tokenizes and calls
    the framework in this process; the labeled scores from the same path, one text at a time."""
    import psutil

    from seqcls.contract import shipped

    decide_mod = shipped.decide()
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    fw = _Framework(release)

    def answer(batch_ids: Sequence[Sequence[int]]) -> list[list[str]]:
        probs = decide_mod.sigmoid(fw.logits(batch_ids))
        rows = decide_mod.decide(probs, graph.thresholds, graph.labels, hierarchy=graph.hierarchy)
        return [[lbl for lbl, _ in row] for row in rows]

    t0 = time.perf_counter()
    predicted = [answer([fw.tokenize(t)])[0] for t in texts]  # one text at a time, as timed below
    log.info("seed table: %s answered %d texts in %.1f s", FRAMEWORK, len(texts), time.perf_counter() - t0)
    with _Worker(lambda text: answer([fw.tokenize(text)])) as worker:
        load = measure.drive(
            lambda: nullcontext(lambda batch: worker.call(batch[0])),
            texts,
            clients=clients,
            texts_per_request=1,
            max_requests=10**7,
            max_seconds=seconds,
        )
    out = {
        "what": fw.what,
        "scores": _scores(gold, predicted, graph.labels),
        "answers": predicted,
        **_summary(load.latencies_ms, load.texts, load.seconds, load.failed),
        "errors": load.errors[:2],
        "memory_mb": round((proc.memory_info().rss - rss0) / 1e6, 1),
        "memory_note": "RSS this process gained by loading the model and serving",
    }
    return out


class _Worker:
    """One thread answering queued calls in arrival order: the seed's Gradio app serves one request at a
    time (its default concurrency limit of 1), and on two cores one framework caller is its best —
    more would only contend for the GIL and the framework's math threads."""

    def __init__(self, fn: Callable[[str], Any]) -> None:
        self.fn = fn
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            text, done, box = item
            try:
                box.append(self.fn(text))
            except Exception as exc:  # handed to the caller
                box.append(exc)
            done.set()

    def call(self, text: str) -> Any:
        done, box = threading.Event(), []
        self.queue.put((text, done, box))
        done.wait()
        if isinstance(box[0], Exception):
            raise box[0]
        return box[0]

    def __enter__(self) -> _Worker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.queue.put(None)
        self.thread.join()


# ----------------------------------------------------------------------------- the Triton rows


def triton_row(
    row: Row,
    index: int,
    checkpoint: Path,
    home: Path,
    work: Path,
    texts: Sequence[str],
    gold: Sequence[Sequence[str]],
    *,
    clients: int,
    seconds: float,
) -> tuple[dict[str, Any], Any, Any]:
    """``row`` served on a fresh local Triton: its labeled scores, the offline gate's, and its load.

    Returns the entry, the release and the published graph (the framework row decides with it)."""
    from seqcls.gates.scoring import predict
    from seqcls.serving.client import endpoints_from_settings, ops_for
    from seqcls.serving.published import served_graph
    from seqcls.serving.repository import Repository
    from seqcls_tools.bench.profiles import bench_release, bench_settings, serve_release
    from seqcls_tools.bench.serving import BenchServer

    with BenchServer(work, index, keep=False) as server:
        release = bench_release(checkpoint, row.profile, bench_settings(home, server))
        t0 = time.perf_counter()
        serve_release(release, row.options)
        bring_up = time.perf_counter() - t0
        repo = Repository.from_settings(release.settings, release.config.model_name)
        version = repo.serving_version()
        assert version is not None, f"{row.name}: nothing served after expose"
        graph = served_graph(repo, version, work / f"scratch-{index}")
        offline = predict(graph, texts, ["CPUExecutionProvider"])
        ops = ops_for(endpoints_from_settings(release.settings))[0]
        t0 = time.perf_counter()
        served = served_answers(ops, texts)
        log.info("seed table: %s answered %d eval texts in %.1f s", row.name, len(texts), time.perf_counter() - t0)
        url = server.config.grpc_url
        measure.run_load(url, texts, clients=clients, texts_per_request=1, max_requests=4 * clients, max_seconds=5)
        load = measure.run_load(
            url, texts, clients=clients, texts_per_request=1, max_requests=10**7, max_seconds=seconds
        )
        entry = {
            "what": row.what,
            "profile": row.profile,
            "options": row.options.to_dict(),
            "version": version,
            "scores": _scores(gold, served, graph.labels),
            "offline_scores": _scores(gold, offline.labels, graph.labels),
            "differing_from_offline": _differing(served, offline.labels),
            "answers": served,
            **_summary(load.latencies_ms, load.texts, load.seconds, load.failed),
            "errors": load.errors[:2],
            "memory_mb": round(sum(measure.ProcessSnapshot.take(server.status().pid).rss.values()) / 1e6, 1),
            "memory_note": "RSS of tritonserver + its python-backend stubs",
            "bring_up_s": round(bring_up, 1),
        }
    return entry, release, graph


def read_eval_texts(path: Path, labels: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Texts and gold label sets of an eval set, read and checked as the quality gate reads it."""
    from seqcls.gates.evalset import read_eval_set

    ev = read_eval_set(path, labels)
    return list(ev.texts), [list(x) for x in ev.labels]


def run(checkpoint: Path, eval_set: Path, work: Path, *, clients: int = 8, seconds: float = 30.0) -> dict[str, Any]:
    """Every row of the table for ``checkpoint`` on ``eval_set`` (see the module docstring)."""
    from seqcls.contract import shipped
    from seqcls.steps import run_release
    from seqcls_tools.bench.profiles import bench_release, bench_settings

    home = work / "home"
    labels = bench_release(checkpoint, "fp32", bench_settings(home)).checkpoint.labels
    texts, gold = read_eval_texts(eval_set, labels)
    results: dict[str, Any] = {
        "meta": {"machine": machine.machine_facts(), "loadavg_start": machine.loadavg()},
        "checkpoint": str(checkpoint),
        "eval_set": {"path": str(eval_set), "texts": len(texts)},
        "labels": list(labels),
        "clients": clients,
        "seconds_per_row": seconds,
        "releases": {},
        "rows": {},
    }
    rows, results["skipped"] = host_rows()
    for profile in dict.fromkeys(r.profile for r in rows):
        t0 = time.perf_counter()
        steps = run_release(bench_release(checkpoint, profile, bench_settings(home)), until="evaluate")
        results["releases"][profile] = {
            "steps_s": {s.step: round(s.seconds, 1) for s in steps},
            "seconds": round(time.perf_counter() - t0, 1),
        }
    fp32 = None
    for i, row in enumerate(rows):
        log.info("seed table: %s (%s), %d clients, %.0f s", row.name, row.what, clients, seconds)
        entry, release, graph = triton_row(
            row, i, checkpoint, home, work, texts, gold, clients=clients, seconds=seconds
        )
        results["rows"][row.name] = entry
        if fp32 is None and row.profile == "fp32":
            fp32 = (release, graph)
            lengths = [len(x) for x in shipped.text().encode(graph.tokenizer, texts)]
            results["tokens"] = token_distribution(lengths)
    assert fp32 is not None
    log.info("seed table: %s, %d clients, %.0f s", FRAMEWORK, clients, seconds)
    framework = framework_direct(fp32[0], fp32[1], texts, gold, clients=clients, seconds=seconds)
    results["rows"] = {FRAMEWORK: framework, **results["rows"]}
    base = framework["scores"]["micro_f1"]
    for entry in results["rows"].values():
        entry["delta_micro_f1_vs_framework"] = round(entry["scores"]["micro_f1"] - base, 4)
        entry["differing_from_framework"] = _differing(entry["answers"], framework["answers"])
    results["meta"]["loadavg_end"] = machine.loadavg()
    return results


# ----------------------------------------------------------------------------- the report


def conditions_line(results: dict[str, Any]) -> str:
    facts = results["meta"]["machine"]
    return conditions.line(
        {
            "cpu": facts.get("cpu_model"),
            "cpus": facts.get("cpus_usable") or facts.get("cpus"),
            "flags": facts.get("isa", {}),
            "loadavg": [results["meta"].get("loadavg_start"), results["meta"].get("loadavg_end")],
            "texts": results.get("tokens", {}),
            "threads": "Triton rows: 1 model instance × 2 ORT intra-op threads, tokenizer and postprocess 1 stub "
            "each; framework row: one worker thread (2 math threads) answering requests in arrival order",
            "batch": "per row (see 'what')",
            "request": f"1 text per request, {results['clients']} clients",
            "load": f"{conditions.PYTHON_CLIENT}; {results['seconds_per_row']:g} s per row; the labeled scores: "
            "each eval text sent alone, once",
        }
    )


def table(results: dict[str, Any]) -> str:
    """The table in Markdown, with the seed's A10 figures beside the rows it has."""
    lines = [
        conditions_line(results),
        "",
        "| configuration | micro-F1 | macro-F1 | Δ micro-F1 vs framework | Δ micro-F1 vs seqcls fp32 "
        "| label sets ≠ framework | P95 ms | QPS | QPS × classic | memory (RSS) "
        "| seed (A10): P95 ms / QPS / GPU memory |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    n = results["eval_set"]["texts"]
    rows = results["rows"]
    classic = (rows.get(CLASSIC_ROW) or {}).get("qps")
    fp32 = (rows.get(FP32_ROW) or {}).get("scores", {}).get("micro_f1")
    for name, e in rows.items():
        seed = SEED.get(name)
        vs_fp32 = f"{e['scores']['micro_f1'] - fp32:+.4f}" if fp32 is not None else "—"
        times = f"{e['qps'] / classic:.2f}×" if classic else "—"
        lines.append(
            f"| {name} | {e['scores']['micro_f1']:.4f} | {e['scores']['macro_f1']:.4f} | "
            f"{e['delta_micro_f1_vs_framework']:+.4f} | {vs_fp32} | {e['differing_from_framework']}/{n} | "
            f"{e['p95_ms']} | {e['qps']} | {times} | {e['memory_mb'] / 1000:.2f} GB | "
            f"{f'{seed[0]} / {seed[1]} / {seed[2]} GB' if seed else '—'} |"
        )
    for name, why in results.get("skipped", {}).items():
        lines.append(f"| {name} | left out: {why} ||||||||||")
    lines += ["", "The same rows scored offline by the quality gate (the published graph, in process):", ""]
    for name, e in results["rows"].items():
        if "offline_scores" in e:
            lines.append(
                f"- {name}: micro-F1 {e['offline_scores']['micro_f1']:.4f}, macro-F1 "
                f"{e['offline_scores']['macro_f1']:.4f}; label sets differing from the served answers: "
                f"{e['differing_from_offline']}/{n}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a trained checkpoint (default: train the quick demo model)")
    parser.add_argument("--eval-set", type=Path, default=DEMO_TEST_SET, help="labeled texts (default: the demo's)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0, help="load per row")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="seqcls-seed-table-") as tmp:
        from seqcls_tools.demo.train import checkpoint_or_quick_demo

        checkpoint = checkpoint_or_quick_demo(args.checkpoint, Path(tmp))
        results = run(checkpoint, args.eval_set, Path(tmp) / "work", clients=args.clients, seconds=args.seconds)
    if args.json:
        args.json.write_text(json.dumps(results, ensure_ascii=False, indent=1), encoding="utf-8")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
