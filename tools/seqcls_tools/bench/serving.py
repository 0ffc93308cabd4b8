"""Serving one configuration on a fresh local Triton: bring-up, in-process limit, the load grid.

Every server :class:`BenchServer` starts is stopped (and its repository removed) on exit.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from seqcls.errors import SeqclsError
from seqcls.serving.repository import ServingOptions
from seqcls_tools.bench import lone, measure
from seqcls_tools.bench.facts import smoke_differences
from seqcls_tools.bench.machine import loadavg
from seqcls_tools.bench.plan import CLIENTS, INPROCESS_RUNS, TEXTS_PER_REQUEST, BenchConfig, Budget, ServingConfig
from seqcls_tools.bench.profiles import bench_release, bench_settings, serve_release
from seqcls_tools.bench.reload import hot_reload

log = logging.getLogger("seqcls_tools.bench")


class BenchServer:
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


def _inprocess(release, config: ServingConfig, texts: list[str], budget: Budget) -> dict[str, Any]:
    from seqcls.contract import shipped
    from seqcls.release.records import effective_profile, served_onnx

    o = config.options
    workers = o.model_instances
    sessions = measure.ort_sessions(
        served_onnx(release.workspace),
        workers=workers,
        intra_op_threads=o.intra_op_threads,
        graph_level=o.graph_optimization_level,
        profile=effective_profile(release),
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


def inprocess_steps(release, options: ServingOptions) -> dict[str, Any]:
    """A lone text's work in process, step by step (:func:`.lone.time_steps`): the release's serving
    tokenizer, its served model in a session of the served thread layout, sigmoid + decide."""
    from seqcls.contract import shipped
    from seqcls.release.records import effective_profile, served_onnx, serving_tokenizer

    text_mod, decide_mod = shipped.text(), shipped.decide()
    (session,) = measure.ort_sessions(
        served_onnx(release.workspace),
        workers=1,
        intra_op_threads=options.intra_op_threads,
        graph_level=options.graph_optimization_level,
        profile=effective_profile(release),
    )
    serving = serving_tokenizer(release)
    max_length = release.config.max_length
    tok = serving.build(text_mod, max_length)
    inputs = [i.name for i in session.get_inputs()]
    labels = list(release.checkpoint.labels)
    thresholds = decide_mod.threshold_vector(labels, release.config.threshold, release.config.thresholds)
    return {
        "tokenize": lambda batch: text_mod.encode(tok, batch),
        "model": lambda ids: session.run(
            ["logits"], text_mod.model_feeds(ids, inputs, max_length=max_length, pad_id=serving.pad_id)
        )[0],
        "decide": lambda logits: decide_mod.decide(
            decide_mod.sigmoid(logits), thresholds, labels, hierarchy=release.config.hierarchy
        ),
    }


def lone_request(server, release, options: ServingOptions, texts: list[str], requests: int) -> dict[str, Any]:
    """A lone request's time per part (:mod:`.lone`): ``requests`` sequential single-text requests on
    ``server``, split by Triton's statistics, beside the same work in process (:func:`inprocess_steps`)
    run in alternating blocks, so the machine's other load drifts over both alike."""

    names = release.config.model_name.names
    steps = inprocess_steps(release, options)
    every_length = one_per_length(texts, [len(x) for x in steps["tokenize"](list(texts))])
    result: dict[str, Any] = {"clients": 1, "texts_per_request": 1}
    result.update(
        lone.served_and_in_process(
            server.config.grpc_url,
            steps,
            texts,
            requests,
            ensemble=names.ensemble,
            composing=names.composing,
            warm=every_length,
        )
    )
    result["inprocess"]["tokenizer"] = "hf"  # classic serves PaddleNLP's tokenizer; in process it is seqcls_text's
    log.info(
        "bench: lone request — served p50 %.2f ms (%s), in process p50 %.2f ms: %.2fx",
        result["served"]["client_p50_ms"],
        ", ".join(f"{p['part']} {p['ms']:.2f}" for p in result["served"]["parts"]),
        result["inprocess"]["p50_ms"],
        result["served_over_inprocess"]["p50"],
    )
    result["floor"] = lone_floor(server, names.ensemble, steps, texts, requests, every_length)
    return result


def lone_floor(
    server, ensemble: str, steps: dict[str, Any], texts: list[str], requests: int, warm: list[str]
) -> dict[str, Any]:
    """The same lone requests to an empty python model with the served ensemble's input and batch size
    (:func:`seqcls_tools.bench.direct.floor_model`, loaded with override and unloaded after), beside the same
    in-process runs: what one python stub hop costs when the model does nothing, and so the best lone speed
    (``ceiling``, in process / (in process + floor)) any python model could reach for this work here."""
    from google.protobuf import json_format

    from seqcls.serving.client import Endpoint, TritonOps
    from seqcls_tools.bench.direct import load_floor

    url = server.config.grpc_url
    op = TritonOps(Endpoint(url, control_key=server.control_key))
    config = op.client.get_model_config(ensemble).config
    name = load_floor(op, json_format.MessageToJson(config), ensemble)
    try:
        warm_load = {"clients": 1, "texts_per_request": 1, "max_requests": 10**9}
        measure.run_load(url, texts, **warm_load, max_seconds=1.0, model=name)  # the stub's first runs
        r = lone.served_and_in_process(url, steps, texts, requests, ensemble=name, composing=[name], warm=warm)
    finally:
        op.unload(name)
    floor, inproc = r["served"]["client_p50_ms"], r["inprocess"]["p50_ms"]
    out = {
        "model": name,
        "p50_ms": floor,
        "inprocess_p50_ms": inproc,
        "ceiling": lone.ceiling(inproc, floor),
        "parts": r["served"]["parts"],
    }
    log.info(
        "bench: an empty python model answers a lone request in %.2f ms: with %.2f ms of work in process, no "
        "python model's lone speed exceeds %.2fx",
        floor,
        inproc,
        out["ceiling"],
    )
    return out


def cell(server, texts: list[str], clients: int, per_request: int, budget: Budget, offset: int) -> dict[str, Any]:
    url = server.config.grpc_url
    pid = server.status().pid
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


def one_per_length(texts: list[str], lengths: list[int]) -> list[str]:
    """The first text of each distinct token length (``lengths[i]`` is ``texts[i]``'s)."""
    firsts: dict[int, str] = {}
    for text, n in zip(texts, lengths, strict=True):
        firsts.setdefault(n, text)
    return list(firsts.values())


def release_lengths(release, texts: list[str]) -> list[int]:
    """Each text's token length under the release's serving tokenizer (what the served model sees)."""
    from seqcls.contract import shipped
    from seqcls.release.records import serving_tokenizer

    tok = serving_tokenizer(release).build(shipped.text(), release.config.max_length)
    return [len(x) for x in shipped.text().encode(tok, texts)]


def warm_up(server, texts: list[str], budget: Budget, every_length: list[str] | None = None) -> None:
    """Unmeasured load first, so stubs, ORT sessions and caches are hot before cells are timed; first one
    request of each token length in ``every_length`` (an engine such as OpenVINO pays a first-time cost per
    input length, which a few seconds of load does not reach for every length of the corpus)."""
    if every_length:
        measure.run_load(
            server.config.grpc_url,
            every_length,
            clients=1,
            texts_per_request=1,
            max_requests=len(every_length),
            max_seconds=300.0,
        )
    measure.run_load(
        server.config.grpc_url,
        texts,
        clients=max(CLIENTS),
        texts_per_request=1,
        max_requests=budget.cell_requests,
        max_seconds=budget.warmup_seconds,
    )


def config_entry(config: ServingConfig, *, note: bool = True, **extra: Any) -> dict[str, Any]:
    """The start of a configuration's results entry; ``extra`` (a skip reason, an error) goes before ``cells``."""
    entry: dict[str, Any] = {"name": config.name, "profile": config.profile, "group": config.group}
    if note:
        entry["note"] = config.note
    entry.update(description=config.describe(), options=config.options.to_dict(), **extra, cells=[])
    return entry


def _bring_up(entry: dict[str, Any], release, options: ServingOptions) -> bool:
    """Run the serving steps; record their seconds and the smoke result in ``entry``.

    False when the smoke test failed (a finding, the release is not measured); any other failure
    means a broken benchmark and is raised.
    """
    t0 = time.perf_counter()
    done: dict[str, Any] = {}
    try:
        serve_release(release, options, done)
    except SeqclsError as exc:
        if "smoke" in done or "reload" not in done:
            raise  # only a failed smoke is a finding; anything else is a broken benchmark
        entry["smoke"] = {"passed": False, "error": str(exc)[:400], **smoke_differences(release.workspace)}
        entry["skipped"] = "smoke failed: the release was not exposed"
        log.error("bench: smoke failed for %s: %s", entry["name"], str(exc)[:300])
    entry["steps"] = {name: round(result.seconds, 2) for name, result in done.items()}
    if "smoke" in done:
        sm = done["smoke"]
        entry["smoke"] = {"passed": True, **{k: sm.summary.get(k) for k in ("texts", "p50_ms", "p95_ms")}}
    entry["ready_seconds"] = round(time.perf_counter() - t0, 2)
    return not entry.get("skipped")


def _grid(config: ServingConfig) -> list[tuple[int, int]]:
    """(clients, texts per request) cells; variants get the corners only, to keep the run short."""
    if config.group == "variant":
        return [(min(CLIENTS), 1), (max(CLIENTS), 1), (max(CLIENTS), max(TEXTS_PER_REQUEST))]
    return [(c, t) for t in TEXTS_PER_REQUEST for c in CLIENTS]


def _measure_grid(server, config: ServingConfig, texts: list[str], budget: Budget) -> list[dict[str, Any]]:
    cells = []
    offset = 0
    for clients, per_request in _grid(config):
        result = cell(server, texts, clients, per_request, budget, offset)
        offset += result["texts"] + 7
        cells.append(result)
        log.info(
            "bench: %-22s %d client(s) x %d text(s): %7.1f sentences/s, p50 %s ms, p95 %s ms, "
            "model batch %s, cores %.2f, failed %d",
            config.name,
            clients,
            per_request,
            result["sentences_per_s"],
            result["p50_ms"],
            result["p95_ms"],
            result["triton_batch"].get("seqcls_model"),
            result["cpu_cores"]["total"],
            result["failed"],
        )
    return cells


def _max_rss(cells: list[dict[str, Any]]) -> dict[str, float]:
    rss: dict[str, float] = {}
    for c in cells:
        for role, info in c["rss"].items():
            rss[role] = max(rss.get(role, 0.0), info["max_rss_mb"])
    return rss


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
    """Serve ``config`` on a fresh Triton and measure it (and, if asked, a hot reload to another profile)."""
    entry = config_entry(config)
    with BenchServer(work, index, keep) as server:
        release = bench_release(checkpoint, config.profile, bench_settings(home, server))
        if not _bring_up(entry, release, config.options):
            return entry
        log.info("bench: %s serving (%s) — %s", config.name, config.describe(), entry["steps"])
        warm_up(server, texts, budget, one_per_length(texts, release_lengths(release, texts)))
        entry["inprocess"] = _inprocess(release, config, texts, budget)
        log.info(
            "bench: %s in-process limit — %s",
            config.name,
            ", ".join(f"{k} {v['sentences_per_s']}/s" for k, v in entry["inprocess"].items()),
        )
        if config.group != "variant":
            entry["lone"] = lone_request(server, release, config.options, texts, budget.lone_requests)
        entry["cells"] = _measure_grid(server, config, texts, budget)
        entry["max_rss_mb"] = _max_rss(entry["cells"])
        if hot_reload_profile:
            entry["hot_reload"] = hot_reload(server, checkpoint, home, config, hot_reload_profile, texts, budget)
    return entry


def serve_or_skip(
    config: ServingConfig,
    index: int,
    checkpoint: Path,
    home: Path,
    work: Path,
    corpus: list[str],
    cfg: BenchConfig,
    results: dict[str, Any],
    hot_reload_profile: str | None = None,
) -> dict[str, Any]:
    """:func:`serve_config`, unless the profile's release failed its gate; a serving error is recorded, not raised."""
    assert cfg.budget is not None
    release = results["releases"].get(config.profile, {})
    if not release.get("gate_passed"):
        log.warning("bench: %s not served — the %s release failed its parity gate", config.name, config.profile)
        return config_entry(config, note=False, skipped="parity gate failed")
    try:
        return serve_config(
            config,
            index,
            checkpoint,
            home,
            work,
            corpus,
            cfg.budget,
            keep=cfg.keep_work,
            hot_reload_profile=hot_reload_profile,
        )
    except SeqclsError as exc:
        log.error("bench: serving %s failed: %s", config.name, exc)
        return config_entry(config, note=False, error=str(exc)[:600])
