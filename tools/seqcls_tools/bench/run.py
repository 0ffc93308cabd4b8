"""One benchmark run: model, releases, tokenizers, every serving configuration on a real Triton.

Order of work (all in one process; every server it starts is stopped before it returns):

1. corpus + checkpoint (seeded), then the release core (export → convert → validate) once per
   profile — ``fp32``, ``fp32-fused``, ``int8`` — timed step by step;
2. tokenizer throughput, HF ``tokenizers`` (what serving runs) vs PaddleNLP's tokenizer;
3. for each serving configuration: a fresh local Triton (nvidia-pytriton's ``tritonserver``,
   loopback, own repository) → ``publish`` + ``reload`` + ``smoke`` through the library → the
   in-process limit of the same model and thread layout (server idle) → load cells (1/4/8
   clients × 1/8 texts per request) with Triton's batch statistics and the CPU/RSS of the server
   and each python stub → stop;
4. hot reload under load on the last server (another release published and loaded while
   clients keep sending);
5. head-to-head: classic and the contenders (fp32 winner, fp32-fused, int8) all up at once,
   the headline cells (8 clients and 1 client, single text) interleaved over a few rounds —
   the ratios use these medians, because the machine's other load drifts between the
   sequential measurements of step 3.

``classic`` is the PaddleNLP sample rendered by our renderer (paddlenlp tokenizer, no dynamic
batching, ORT ``basic`` graph level, one instance, per-request). The fp32 variants try the other
batching strategies and thread layouts; the winner's options are used for ``fp32-fused`` and
``int8``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.errors import GateError, SeqclsError
from seqcls.records import Published
from seqcls.serving.repository import ServingOptions
from seqcls_tools.bench import measure
from seqcls_tools.bench.corpus import make_corpus, make_labels
from seqcls_tools.bench.facts import convert_facts, gate_facts, parity_report, smoke_differences
from seqcls_tools.bench.model import MEDIUM, TINY, ModelSpec, build_checkpoint

log = logging.getLogger("seqcls_tools.bench")

PROFILES = ("fp32", "fp32-fused", "int8")
CLIENTS = (1, 4, 8)
TEXTS_PER_REQUEST = (1, 8)
#: In-process runs: (texts per batch, each text run on its own). "8 per text" is what a model
#: that never pads across texts would do with an 8-text request.
INPROCESS_RUNS = ((1, False), (8, False), (8, True))
CLASSIC = ServingOptions(
    tokenizer_impl="paddlenlp",
    dynamic_batching=False,
    graph_optimization_level="basic",
    model_instances=1,
    batching="per-request",
)


@dataclass(frozen=True)
class Budget:
    """Bounds of every loop (requests and seconds): the run's length is decided here."""

    corpus: int
    golden: int
    cell_seconds: float
    cell_requests: int
    warmup_seconds: float
    inprocess_seconds: float
    inprocess_batches: int
    tokenizer_seconds: float
    reload_load_seconds: float
    h2h_rounds: int
    h2h_seconds: float


#: Every bound of the full run and of ``--quick``, side by side: field -> (full, quick).
_BUDGETS: dict[str, tuple[Any, Any]] = {
    "corpus": (2000, 200),
    "golden": (64, 32),
    "cell_seconds": (8.0, 0.8),
    "cell_requests": (3000, 40),
    "warmup_seconds": (2.0, 0.3),
    "inprocess_seconds": (4.0, 0.4),
    "inprocess_batches": (2000, 40),
    "tokenizer_seconds": (2.0, 0.3),
    "reload_load_seconds": (120.0, 60.0),
    "h2h_rounds": (3, 1),
    "h2h_seconds": (7.0, 0.5),
}
FULL = Budget(**{name: full for name, (full, _) in _BUDGETS.items()})
QUICK = Budget(**{name: quick for name, (_, quick) in _BUDGETS.items()})


@dataclass(frozen=True)
class ServingConfig:
    name: str
    profile: str
    options: ServingOptions
    group: str  # "classic" | "main" | "variant"
    note: str = ""

    @property
    def layout(self) -> str:
        o = self.options
        return f"{o.model_instances}x{o.intra_op_threads}"

    def describe(self) -> str:
        o = self.options
        parts = [
            f"tokenizer {o.tokenizer_impl}",
            "dyn-batch" if o.dynamic_batching else "no dyn-batch",
            f"{o.model_instances} inst x {o.intra_op_threads} thr",
            o.batching,
            f"pad {o.padding}",
            f"ORT {o.graph_optimization_level}",
        ]
        return ", ".join(parts)


def fp32_variants() -> list[ServingConfig]:
    base = ServingOptions()
    return [
        ServingConfig("fp32", "fp32", base, "main", "default CPU options"),
        ServingConfig(
            "fp32 pad-to-longest", "fp32", replace(base, batching="pad-to-longest"), "variant", "GPU-style batching"
        ),
        ServingConfig(
            "fp32 group-by-length",
            "fp32",
            replace(base, padding="buckets", batching="group-by-length"),
            "variant",
            "length buckets, same-length requests run together",
        ),
        ServingConfig(
            "fp32 2x1",
            "fp32",
            replace(base, dynamic_batching=False, model_instances=2, intra_op_threads=1),
            "variant",
            "two single-threaded instances, requests go to a free instance",
        ),
        ServingConfig(
            "fp32 2x2",
            "fp32",
            replace(base, dynamic_batching=False, model_instances=2, intra_op_threads=2),
            "variant",
            "two instances x two threads (oversubscribed under load)",
        ),
    ]


@dataclass
class BenchConfig:
    out: Path
    quick: bool = False
    seed: int = 0
    keep_work: bool = False
    variants: bool | None = None  # default: on in full mode, off in --quick
    spec: ModelSpec | None = None
    budget: Budget | None = None

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.spec is None:
            self.spec = TINY if self.quick else MEDIUM
        if self.budget is None:
            self.budget = QUICK if self.quick else FULL
        if self.variants is None:
            self.variants = not self.quick


@dataclass
class _State:
    """What the run accumulates; becomes ``results.json``."""

    results: dict[str, Any] = field(default_factory=dict)
    load_samples: list[dict[str, Any]] = field(default_factory=list)


# ----------------------------------------------------------------------------- machine facts


def machine_facts() -> dict[str, Any]:
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    from importlib import metadata

    versions = {}
    for name in ("onnxruntime", "onnx", "paddlepaddle", "paddlenlp", "paddle2onnx", "tokenizers", "nvidia-pytriton"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "isa": {f: f in flags for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")},
        "python": platform.python_version(),
        "versions": versions,
    }


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# ----------------------------------------------------------------------------- releases


def _settings(home: Path, server=None):
    from seqcls.settings import Settings

    if server is None:
        return Settings(home=home)
    cfg = server.config
    return Settings(
        home=home,
        triton_repository=cfg.repository,
        triton_grpc=(cfg.grpc_url,),
        triton_http=(cfg.http_url,),
    )


def _release(checkpoint: Path, profile: str, settings):
    from seqcls.config import ReleaseConfig
    from seqcls.workspace import open_release

    return open_release(checkpoint, ReleaseConfig(model_name=f"bench-{profile}", profile=profile), settings)


def run_releases(checkpoint: Path, home: Path) -> dict[str, Any]:
    from seqcls.steps import run_release

    out: dict[str, Any] = {}
    for profile in PROFILES:
        release = _release(checkpoint, profile, _settings(home))
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"profile": profile, "steps": {}}
        try:
            for result in run_release(release, until="validate"):
                entry["steps"][result.step] = round(result.seconds, 2)
            entry["gate_passed"] = True
        except GateError as exc:
            entry["gate_passed"] = False
            entry["gate_error"] = str(exc)[:600]
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        entry["convert"] = convert_facts(release.workspace)
        report = parity_report(release.workspace)
        if report is not None:
            entry["gate"] = gate_facts(report)
        out[profile] = entry
        log.info(
            "bench: release %s — %s in %.0fs (%s)",
            profile,
            "gate passed" if entry["gate_passed"] else "GATE FAILED",
            entry["seconds"],
            ", ".join(f"{k} {v}s" for k, v in entry["steps"].items()),
        )
    return out


def batch_dependence(checkpoint: Path, home: Path, texts: list[str], batch: int = 16) -> dict[str, Any]:
    """Does a text's answer depend on what it is batched with? Each profile's served model on the
    golden texts, each text alone vs in padded batches of ``batch`` (how validate runs them).

    fp32 models differ only by float rounding; dynamic INT8 computes each activation's
    quantization range over the whole batch, so neighbours (and their padding) move the logits.
    """
    import numpy as np

    from seqcls.records import served_onnx
    from seqcls.serving import shipped

    text_mod, decide_mod = shipped.text(), shipped.decide()
    out: dict[str, Any] = {}
    for profile in PROFILES:
        release = _release(checkpoint, profile, _settings(home))
        model = served_onnx(release.workspace)
        if not model.is_file():
            continue
        (session,) = measure.ort_sessions(model, workers=1, intra_op_threads=1, graph_level="all")
        tok = text_mod.build_tokenizer(release.checkpoint.vocab_file, max_length=release.config.max_length)
        ids = text_mod.encode(tok, texts)

        def run(rows, session=session):
            a, b = text_mod.pad(rows)
            return session.run(["logits"], {"input_ids": a, "token_type_ids": b})[0]

        alone = np.concatenate([run([x]) for x in ids])
        batched = np.concatenate([run(ids[i : i + batch]) for i in range(0, len(ids), batch)])
        p1, p2 = decide_mod.sigmoid(alone), decide_mod.sigmoid(batched)
        labels = list(release.checkpoint.labels)
        th = decide_mod.threshold_vector(labels, release.config.threshold)
        d1 = decide_mod.decide(p1, th, labels, hierarchy=release.config.hierarchy)
        d2 = decide_mod.decide(p2, th, labels, hierarchy=release.config.hierarchy)
        changed = sum(1 for a, b in zip(d1, d2, strict=True) if [x[0] for x in a] != [x[0] for x in b])
        out[profile] = {
            "texts": len(texts),
            "batch": batch,
            "prob_max_abs_diff": float(np.abs(p1 - p2).max(initial=0.0)),
            "label_sets_changed": changed,
        }
    log.info(
        "bench: alone vs batched — %s",
        ", ".join(
            f"{k}: {v['label_sets_changed']} label sets, max |Δp| {v['prob_max_abs_diff']:.2g}" for k, v in out.items()
        ),
    )
    return out


def _warm_up(server, texts: list[str], budget: Budget) -> None:
    """Unmeasured load first, so stubs, ORT sessions and caches are hot before cells are timed."""
    measure.run_load(
        server.config.grpc_url,
        texts,
        clients=max(CLIENTS),
        texts_per_request=1,
        max_requests=budget.cell_requests,
        max_seconds=budget.warmup_seconds,
    )


# ----------------------------------------------------------------------------- tokenizers


def tokenizer_benchmark(checkpoint: Path, texts: list[str], budget: Budget, max_length: int = 128) -> dict[str, Any]:
    from paddlenlp.transformers import AutoTokenizer

    from seqcls.serving import shipped

    text_mod = shipped.text()
    hf = text_mod.build_tokenizer(checkpoint / "vocab.txt", lowercase=True, max_length=max_length)
    pn = AutoTokenizer.from_pretrained(str(checkpoint))

    def hf_encode(batch: list[str]):
        return text_mod.encode(hf, batch)

    def pn_encode(batch: list[str]):
        return pn(batch, max_length=max_length, truncation=True, padding=False)["input_ids"]

    out: dict[str, Any] = {}
    for name, fn in (("hf", hf_encode), ("paddlenlp", pn_encode)):
        for batch in (1, 8):
            out[f"{name}/batch{batch}"] = measure.tokenizer_throughput(
                fn, texts, batch_size=batch, max_seconds=budget.tokenizer_seconds, max_texts=20000
            )
    log.info(
        "bench: tokenizers — HF %.0f sentences/s, paddlenlp %.0f sentences/s (one text per call)",
        out["hf/batch1"]["sentences_per_s"],
        out["paddlenlp/batch1"]["sentences_per_s"],
    )
    return out


# ----------------------------------------------------------------------------- serving


class _Server:
    """A fresh local Triton for one configuration; stopped (and its repository removed) on exit."""

    def __init__(self, work: Path, index: int, keep: bool, state: str = "state") -> None:
        from seqcls.localtriton import LocalTriton, TritonServerConfig, free_ports

        http, grpc, metrics = free_ports(3)
        self.repo = work / "triton" / f"repo-{index}"
        shutil.rmtree(self.repo, ignore_errors=True)
        self.keep = keep
        self.server = LocalTriton(
            TritonServerConfig(
                repository=self.repo,
                http_port=http,
                grpc_port=grpc,
                metrics_port=metrics,
                state_dir=work / "triton" / state,
                startup_timeout=120.0,
            )
        )

    def __enter__(self):
        self.server.start()
        return self.server

    def __exit__(self, *exc: object) -> None:
        try:
            self.server.stop()
        finally:
            if not self.keep:
                shutil.rmtree(self.repo, ignore_errors=True)


def _server_pid(server) -> int | None:
    return server.status().pid


def _inprocess(release, config: ServingConfig, texts: list[str], budget: Budget) -> dict[str, Any]:
    from seqcls.records import served_onnx
    from seqcls.serving import shipped

    o = config.options
    workers = o.model_instances
    sessions = measure.ort_sessions(
        served_onnx(release.workspace),
        workers=workers,
        intra_op_threads=o.intra_op_threads,
        graph_level=o.graph_optimization_level,
    )
    text_mod = shipped.text()
    tok = text_mod.build_tokenizer(
        release.checkpoint.vocab_file, lowercase=release.checkpoint.do_lower_case, max_length=release.config.max_length
    )

    def encode(batch: list[str]):
        return text_mod.encode(tok, batch)

    def pad(ids):
        return text_mod.pad(ids, strategy="longest")

    out = {}
    for batch, per_text in INPROCESS_RUNS:
        out[f"batch{batch}{'-per-text' if per_text else ''}"] = measure.inprocess_limit(
            sessions,
            encode,
            pad,
            texts,
            batch_size=batch,
            max_seconds=budget.inprocess_seconds,
            max_batches=budget.inprocess_batches,
            per_text=per_text,
        )
    del sessions
    return out


def _cell(server, texts: list[str], clients: int, per_request: int, budget: Budget, offset: int) -> dict[str, Any]:
    url = server.config.grpc_url
    pid = _server_pid(server)
    load0 = loadavg()
    counts0 = measure.triton_counts(url)
    snap0 = measure.ProcessSnapshot.take(pid)
    cpu0 = measure.self_cpu()
    result = measure.run_load(
        url,
        texts,
        clients=clients,
        texts_per_request=per_request,
        max_requests=budget.cell_requests,
        max_seconds=budget.cell_seconds,
        offset=offset,
    )
    client_cpu = measure.self_cpu() - cpu0
    snap1 = measure.ProcessSnapshot.take(pid)
    counts1 = measure.triton_counts(url)
    cell = result.summary()
    cell["triton_batch"] = measure.batch_between(counts0, counts1)
    cell["cpu_cores"] = measure.cpu_between(snap0, snap1)
    cell["cpu_cores"]["client"] = round(client_cpu / max(result.seconds, 1e-9), 3)
    served_cpu = cell["cpu_cores"]["total"] * (snap1.taken - snap0.taken) + client_cpu
    cell["cpu_ms_per_sentence"] = round(1000.0 * served_cpu / result.texts, 2) if result.texts else None
    cell["rss"] = snap1.rss_by_role()
    cell["loadavg"] = [load0, loadavg()]
    return cell


def serving_steps() -> tuple[str, ...]:
    """The step table's steps that take a validated release to serving: publish up to promote
    (publish, reload, smoke, expose today); register and promote need MLflow, which the bench skips."""
    from seqcls.steps import ORDER

    return ORDER[ORDER.index("publish") : ORDER.index("promote")]


def serve_release(release, options: ServingOptions, results: dict | None = None) -> dict[str, Any]:
    """Run :func:`serving_steps` on ``release`` with the bench's serving options; step name → result.

    ``results`` (if given) is filled as the steps finish, so a caller still has them when one fails.
    """
    import inspect

    from seqcls.steps import step

    results = {} if results is None else results
    for name in serving_steps():
        fn = step(name).load()
        kwargs = {"options": options} if "options" in inspect.signature(fn).parameters else {}
        results[name] = fn(release, **kwargs)
    return results


def serve_config(
    config: ServingConfig,
    index: int,
    checkpoint: Path,
    home: Path,
    work: Path,
    texts: list[str],
    budget: Budget,
    *,
    keep: bool,
    hot_reload_profile: str | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": config.name,
        "profile": config.profile,
        "group": config.group,
        "note": config.note,
        "description": config.describe(),
        "options": config.options.to_dict(),
        "cells": [],
    }
    with _Server(work, index, keep) as server:
        settings = _settings(home, server)
        release = _release(checkpoint, config.profile, settings)
        t0 = time.perf_counter()
        done: dict[str, Any] = {}
        try:
            serve_release(release, config.options, done)
        except SeqclsError as exc:
            if "smoke" in done or "reload" not in done:
                raise  # only a failed smoke is a finding; anything else is a broken benchmark
            entry["smoke"] = {"passed": False, "error": str(exc)[:400], **smoke_differences(release.workspace)}
            entry["skipped"] = "smoke failed: the release was not exposed"
            log.error("bench: smoke failed for %s: %s", config.name, str(exc)[:300])
        entry["steps"] = {name: round(result.seconds, 2) for name, result in done.items()}
        if "smoke" in done:
            sm = done["smoke"]
            entry["smoke"] = {"passed": True, **{k: sm.summary.get(k) for k in ("texts", "p50_ms", "p95_ms")}}
        entry["ready_seconds"] = round(time.perf_counter() - t0, 2)
        if entry.get("skipped"):
            return entry
        log.info("bench: %s serving (%s) — %s", config.name, config.describe(), entry["steps"])
        _warm_up(server, texts, budget)
        entry["inprocess"] = _inprocess(release, config, texts, budget)
        log.info(
            "bench: %s in-process limit — %s",
            config.name,
            ", ".join(f"{k} {v['sentences_per_s']}/s" for k, v in entry["inprocess"].items()),
        )
        offset = 0
        grid = [(c, t) for t in TEXTS_PER_REQUEST for c in CLIENTS]
        if config.group == "variant":  # variants: the corners only, to keep the run short
            grid = [(min(CLIENTS), 1), (max(CLIENTS), 1), (max(CLIENTS), max(TEXTS_PER_REQUEST))]
        for clients, per_request in grid:
            cell = _cell(server, texts, clients, per_request, budget, offset)
            offset += cell["texts"] + 7
            entry["cells"].append(cell)
            log.info(
                "bench: %-22s %d client(s) x %d text(s): %7.1f sentences/s, p50 %s ms, p95 %s ms, "
                "model batch %s, cores %.2f, failed %d",
                config.name,
                clients,
                per_request,
                cell["sentences_per_s"],
                cell["p50_ms"],
                cell["p95_ms"],
                cell["triton_batch"].get("seqcls_model"),
                cell["cpu_cores"]["total"],
                cell["failed"],
            )
        rss: dict[str, float] = {}
        for cell in entry["cells"]:
            for role, info in cell["rss"].items():
                rss[role] = max(rss.get(role, 0.0), info["max_rss_mb"])
        entry["max_rss_mb"] = rss
        if hot_reload_profile:
            entry["hot_reload"] = hot_reload(server, checkpoint, home, config, hot_reload_profile, texts, budget)
    return entry


def hot_reload(
    server, checkpoint: Path, home: Path, config: ServingConfig, other_profile: str, texts: list[str], budget: Budget
) -> dict[str, Any]:
    """Take another release to serving (:func:`serving_steps`) while 4 clients keep sending single-text requests."""
    settings = _settings(home, server)
    other = _release(checkpoint, other_profile, settings)
    stop = threading.Event()
    box: dict[str, Any] = {}

    def load() -> None:
        box["result"] = measure.run_load(
            server.config.grpc_url,
            texts,
            clients=4,
            texts_per_request=1,
            max_requests=10**9,
            max_seconds=budget.reload_load_seconds,
            stop=stop,
        )

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    error = None
    try:
        time.sleep(1.0)
        t0 = time.perf_counter()
        done = serve_release(other, config.options)
        pub, rel = done["publish"], done["reload"]
        switch_seconds = time.perf_counter() - t0
        time.sleep(1.0)
    except SeqclsError as exc:
        error = str(exc)[:400]
        pub = rel = None
        switch_seconds = None
    finally:
        stop.set()
        thread.join()
    result: measure.LoadResult = box["result"]
    out = {
        "from_profile": config.profile,
        "to_profile": other_profile,
        "to_version": Published.load(other.workspace).version if pub else None,
        "publish_seconds": round(pub.seconds, 2) if pub else None,
        "reload_seconds": rel.summary.get("seconds") if rel else None,
        "publish_and_reload_seconds": round(switch_seconds, 2) if switch_seconds is not None else None,
        "requests": result.requests,
        "failed": result.failed,
        "errors": result.errors[:3],
        "load_seconds": round(result.seconds, 2),
        **measure.percentiles(result.latencies_ms),
        "error": error,
    }
    log.info(
        "bench: hot reload %s → %s under load: reload %.1fs, %d requests, %d failed",
        config.profile,
        other_profile,
        out["reload_seconds"] or -1,
        out["requests"],
        out["failed"],
    )
    return out


def head_to_head(
    plan: list[ServingConfig], checkpoint: Path, home: Path, work: Path, texts: list[str], budget: Budget, keep: bool
) -> dict[str, Any]:
    """The headline cells again, with every contender's server up at once and the cells
    interleaved (A B C D, A B C D, ...), so slow changes in the machine's other load hit all of
    them alike. Idle servers use no CPU. Ratios are computed from the medians of these rounds."""
    out: dict[str, Any] = {"rounds": budget.h2h_rounds, "seconds_per_cell": budget.h2h_seconds, "configs": {}}
    cell_budget = replace(budget, cell_seconds=budget.h2h_seconds)
    with contextlib.ExitStack() as stack:
        servers = {}
        for i, config in enumerate(plan):
            server = stack.enter_context(_Server(work, 100 + i, keep, state=f"state-h2h-{i}"))
            release = _release(checkpoint, config.profile, _settings(home, server))
            serve_release(release, config.options)
            _warm_up(server, texts, budget)
            servers[config.name] = server
            out["configs"][config.name] = {"cells": []}
        log.info("bench: head-to-head — %s up, %d interleaved rounds", ", ".join(servers), budget.h2h_rounds)
        offset = 0
        for r in range(budget.h2h_rounds):
            for clients in (max(CLIENTS), 1):
                for name, server in servers.items():
                    cell = _cell(server, texts, clients, 1, cell_budget, offset)
                    offset += cell["texts"] + 3
                    cell["round"] = r
                    out["configs"][name]["cells"].append(cell)
                    log.info(
                        "bench: head-to-head round %d %-22s %d client(s): %7.1f sentences/s, p95 %s ms",
                        r + 1,
                        name,
                        clients,
                        cell["sentences_per_s"],
                        cell["p95_ms"],
                    )
    import numpy as np

    for entry in out["configs"].values():
        for clients, key in ((max(CLIENTS), "sentences_per_s"), (1, "p95_ms"), (max(CLIENTS), "cpu_ms_per_sentence")):
            values = [c[key] for c in entry["cells"] if c["clients"] == clients and c.get(key) is not None]
            entry[f"median_{clients}c_{key}"] = round(float(np.median(values)), 2) if values else None
            entry[f"all_{clients}c_{key}"] = values
    return out


def pick_winner(configs: dict[str, dict[str, Any]]) -> str | None:
    """The fp32 configuration that spends the least CPU per sentence at 8 clients x 1 text.

    Not the most sentences/s: on a shared machine wall-clock throughput of sequential
    measurements swings with other work (±50 % was seen on 2 cores), while CPU per sentence
    barely moves, and with every variant able to keep both cores busy it is what decides
    throughput on a machine of one's own. Falls back to sentences/s if CPU was not measured.
    """
    fp32 = {
        n: e
        for n, e in configs.items()
        if e.get("profile") == "fp32" and e.get("group") != "classic" and e.get("cells")
    }
    if not fp32:
        return None
    from seqcls_tools.bench.report import cell_value

    top = max(CLIENTS)
    cpu = {n: cell_value(e, top, 1, "cpu_ms_per_sentence") for n, e in fp32.items()}
    if all(cpu.values()):
        return min(cpu, key=cpu.__getitem__)
    return max(fp32, key=lambda n: cell_value(fp32[n], top, 1, "sentences_per_s") or 0.0)


# ----------------------------------------------------------------------------- the run


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the whole benchmark; writes ``results.json``, ``results.md`` and ``plot.png`` to
    ``cfg.out`` and returns the results (with ``ratios``)."""
    from seqcls_tools.bench import report

    assert cfg.spec is not None and cfg.budget is not None
    budget = cfg.budget
    t_start = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    work = cfg.out / "work"
    home = work / "home"
    results: dict[str, Any] = {
        "meta": {
            "mode": "quick" if cfg.quick else "full",
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine_facts(),
            "loadavg_start": loadavg(),
            "budget": budget.__dict__,
            "clients": list(CLIENTS),
            "texts_per_request": list(TEXTS_PER_REQUEST),
        },
    }
    try:
        corpus = make_corpus(budget.corpus, seed=cfg.seed)
        labels = make_labels(cfg.spec.num_labels)
        checkpoint = work / "checkpoint"
        t0 = time.perf_counter()
        model_facts = build_checkpoint(
            checkpoint, cfg.spec, corpus, labels, golden=corpus[-budget.golden :], seed=cfg.seed
        )
        model_facts["build_seconds"] = round(time.perf_counter() - t0, 2)
        results["model"] = model_facts
        results["corpus"] = _corpus_facts(corpus, checkpoint)
        results["releases"] = run_releases(checkpoint, home)
        results["batch_dependence"] = batch_dependence(checkpoint, home, corpus[-budget.golden :])
        results["tokenizers"] = tokenizer_benchmark(checkpoint, corpus, budget)
        configs: dict[str, dict[str, Any]] = {}
        results["configs"] = configs
        plan = [ServingConfig("classic", "fp32", CLASSIC, "classic", "PaddleNLP triton_serving sample equivalent")]
        plan += fp32_variants() if cfg.variants else fp32_variants()[:1]
        index = 0
        for config in plan:
            index += 1
            configs[config.name] = _serve_or_skip(config, index, checkpoint, home, work, corpus, budget, cfg, results)
        winner = pick_winner(configs)
        results["fp32_winner"] = winner
        options = configs[winner]["options"] if winner else ServingOptions().to_dict()
        chosen = ServingOptions(**{**options, "buckets": tuple(options["buckets"])})
        log.info("bench: fp32 winner %s — fp32-fused and int8 served with its options", winner)
        last = [p for p in ("fp32-fused", "int8") if results["releases"][p].get("gate_passed")]
        for profile in ("fp32-fused", "int8"):
            index += 1
            config = ServingConfig(profile, profile, chosen, "main", f"options of {winner}")
            reload_to = None
            if last and profile == last[-1]:
                reload_to = next((p for p in ("fp32-fused", "fp32") if p != profile), "fp32")
            configs[profile] = _serve_or_skip(
                config, index, checkpoint, home, work, corpus, budget, cfg, results, hot_reload_profile=reload_to
            )
            if reload_to and "hot_reload" in configs[profile]:
                results["hot_reload"] = configs[profile].pop("hot_reload")
        contenders = [plan[0]]
        contenders += [c for c in plan if c.name == winner]
        contenders += [
            ServingConfig(p, p, chosen, "main", f"options of {winner}")
            for p in ("fp32-fused", "int8")
            if configs.get(p, {}).get("cells")
        ]
        if cfg.quick:  # same code path, fewer servers to start
            contenders = contenders[:2]
        if len(contenders) > 1 and configs.get("classic", {}).get("cells"):
            results["head_to_head"] = head_to_head(contenders, checkpoint, home, work, corpus, budget, cfg.keep_work)
    finally:
        if not cfg.keep_work:
            shutil.rmtree(work, ignore_errors=True)
        results["meta"]["loadavg_end"] = loadavg()
        results["meta"]["seconds"] = round(time.perf_counter() - t_start, 1)
        results["meta"]["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["ratios"] = report.ratios(results)
    report.write_all(results, cfg.out)
    return results


def _serve_or_skip(
    config: ServingConfig,
    index: int,
    checkpoint: Path,
    home: Path,
    work: Path,
    corpus: list[str],
    budget: Budget,
    cfg: BenchConfig,
    results: dict[str, Any],
    hot_reload_profile: str | None = None,
) -> dict[str, Any]:
    release = results["releases"].get(config.profile, {})
    if not release.get("gate_passed"):
        log.warning("bench: %s not served — the %s release failed its parity gate", config.name, config.profile)
        return {
            "name": config.name,
            "profile": config.profile,
            "group": config.group,
            "description": config.describe(),
            "options": config.options.to_dict(),
            "skipped": "parity gate failed",
            "cells": [],
        }
    try:
        return serve_config(
            config,
            index,
            checkpoint,
            home,
            work,
            corpus,
            budget,
            keep=cfg.keep_work,
            hot_reload_profile=hot_reload_profile,
        )
    except SeqclsError as exc:
        log.error("bench: serving %s failed: %s", config.name, exc)
        return {
            "name": config.name,
            "profile": config.profile,
            "group": config.group,
            "description": config.describe(),
            "options": config.options.to_dict(),
            "error": str(exc)[:600],
            "cells": [],
        }


def _corpus_facts(corpus: list[str], checkpoint: Path) -> dict[str, Any]:
    import numpy as np

    from seqcls.serving import shipped

    text_mod = shipped.text()
    tok = text_mod.build_tokenizer(checkpoint / "vocab.txt", lowercase=True, max_length=128)
    lengths = [len(x) for x in text_mod.encode(tok, corpus)]
    chars = [len(t) for t in corpus]
    return {
        "sentences": len(corpus),
        "chars_mean": round(float(np.mean(chars)), 1),
        "chars_min": min(chars),
        "chars_max": max(chars),
        "tokens_mean": round(float(np.mean(lengths)), 1),
        "tokens_p95": int(np.percentile(lengths, 95)),
        "tokens_max": max(lengths),
    }
