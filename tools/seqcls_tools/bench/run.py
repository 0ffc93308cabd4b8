"""One benchmark run: model, releases, tokenizers, every serving configuration on a real Triton.

Order of work (all in one process; every server it starts is stopped before it returns):

0. the host's roofline (:mod:`.roofline`: bandwidth and matrix peaks, seconds, before any server starts);
1. corpus + checkpoint (seeded), then the release core (export → convert → validate) once per
   profile — ``fp32``, ``fp32-fused``, ``int8``, and ``bf16`` where the host runs it — timed step by step;
2. ``profile: auto``'s timing of every released profile (:mod:`.auto_rates`), then tokenizer throughput,
   HF ``tokenizers`` (what serving runs) vs PaddleNLP's tokenizer;
3. for each serving configuration: a fresh local Triton (nvidia-pytriton's ``tritonserver``,
   loopback, own repository) → ``publish`` + ``reload`` + ``smoke`` through the library → the
   in-process limit of the same model and thread layout (server idle) → a lone request's parts
   (:mod:`.lone`; not for the variants) → load cells (1/4/8
   clients × 1/8 texts per request) with Triton's batch statistics and the CPU/RSS of the server
   and each python stub → stop;
4. hot reload under load on int8's server (another release published and loaded while
   clients keep sending);
5. head-to-head: classic and the contenders (fp32 winner, fp32-fused, int8, bf16) all up at once,
   the headline cells (8 clients and 1 client, single text) interleaved over a few rounds —
   the ratios use these medians, because the machine's other load drifts between the
   sequential measurements of step 3;
6. every profile's served and in-process rate as a fraction of its roofline (:func:`.roofline.profile_rows`).

``classic`` is the PaddleNLP sample rendered by our renderer (paddlenlp tokenizer, no dynamic
batching, ORT ``basic`` graph level, one instance, per-request). The fp32 variants try the other
batching strategies and thread layouts; the winner's options are used for ``fp32-fused`` and
``int8``.

This module is the orchestration; the work is in :mod:`.plan` (profiles, grid, budgets,
configurations), :mod:`.profiles` (releases, batch dependence, the serving steps),
:mod:`.tokens` (corpus token lengths, tokenizer throughput), :mod:`.serving` (one configuration on
a fresh Triton), :mod:`.reload` (hot reload under load), :mod:`.head_to_head` and :mod:`.report`
(:mod:`.ratios`, :mod:`.markdown`, the plot; :mod:`.conditions` names each table's conditions).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.serving.repository import ServingOptions
from seqcls_tools.bench import conditions, roofline
from seqcls_tools.bench.auto_rates import auto_rates
from seqcls_tools.bench.corpus import make_corpus, make_labels
from seqcls_tools.bench.head_to_head import head_to_head
from seqcls_tools.bench.machine import loadavg, machine_facts
from seqcls_tools.bench.model import build_checkpoint
from seqcls_tools.bench.plan import (
    CLASSIC,
    CLIENTS,
    TEXTS_PER_REQUEST,
    BenchConfig,
    ServingConfig,
    fp32_variants,
    host_profiles,
)
from seqcls_tools.bench.profiles import batch_dependence, run_releases
from seqcls_tools.bench.serving import serve_or_skip
from seqcls_tools.bench.tokens import corpus_facts, tokenizer_benchmark

__all__ = ["BenchConfig", "pick_winner", "run_bench"]

log = logging.getLogger("seqcls_tools.bench")
#: The optimised profiles served with the fp32 winner's options, those this host runs (:func:`host_profiles`).
OPTIMISED = ("fp32-fused", "int8", "bf16")


@dataclass
class _Run:
    """One run's inputs and results; :meth:`serve` numbers the servers it starts."""

    cfg: BenchConfig
    checkpoint: Path
    home: Path
    work: Path
    corpus: list[str]
    results: dict[str, Any]
    index: int = 0

    @property
    def configs(self) -> dict[str, dict[str, Any]]:
        return self.results["configs"]

    def serve(self, config: ServingConfig, hot_reload_profile: str | None = None) -> dict[str, Any]:
        self.index += 1
        return serve_or_skip(
            config,
            self.index,
            self.checkpoint,
            self.home,
            self.work,
            self.corpus,
            self.cfg,
            self.results,
            hot_reload_profile=hot_reload_profile,
        )


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


def _meta(cfg: BenchConfig) -> dict[str, Any]:
    assert cfg.budget is not None
    profiles, left_out = host_profiles()
    return {
        "profiles": list(profiles),
        "profiles_left_out": left_out,
        "mode": "quick" if cfg.quick else "full",
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "loadavg_start": loadavg(),
        "budget": cfg.budget.__dict__,
        "clients": list(CLIENTS),
        "texts_per_request": list(TEXTS_PER_REQUEST),
    }


def _prepare(cfg: BenchConfig, work: Path, home: Path, results: dict[str, Any]) -> _Run:
    """Corpus and checkpoint, the releases, batch dependence and the tokenizers: everything before serving."""
    assert cfg.spec is not None and cfg.budget is not None
    budget = cfg.budget
    profiles = tuple(results["meta"]["profiles"])
    # first, while no server runs: the host's bandwidth and matrix peaks, on the threads a model instance uses
    host = roofline.measure_host(ServingOptions().intra_op_threads, quick=cfg.quick)
    results["roofline"] = {"host": host.to_dict()}
    corpus = make_corpus(budget.corpus, seed=cfg.seed)
    labels = make_labels(cfg.spec.num_labels)
    checkpoint = work / "checkpoint"
    t0 = time.perf_counter()
    model_facts = build_checkpoint(checkpoint, cfg.spec, corpus, labels, golden=corpus[-budget.golden :], seed=cfg.seed)
    model_facts["build_seconds"] = round(time.perf_counter() - t0, 2)
    results["model"] = model_facts
    results["corpus"] = corpus_facts(corpus, checkpoint, golden=budget.golden)
    shape = roofline.ModelShape.from_config(checkpoint / "config.json", labels=cfg.spec.num_labels)
    results["roofline"]["model"] = roofline.model_cost(shape, results["corpus"]["tokens"])
    results["releases"] = run_releases(checkpoint, home, profiles)
    results["batch_dependence"] = batch_dependence(checkpoint, home, corpus[-budget.golden :], profiles=profiles)
    results["auto"] = auto_rates(checkpoint, home, corpus, results["releases"], clients=max(CLIENTS))
    results["tokenizers"] = tokenizer_benchmark(checkpoint, corpus, budget)
    results["configs"] = {}
    return _Run(cfg, checkpoint, home, work, corpus, results)


def _serve_fp32(run: _Run) -> list[ServingConfig]:
    """classic and the fp32 configurations (the variants unless switched off); returns the plan served."""
    plan = [ServingConfig("classic", "fp32", CLASSIC, "classic", "PaddleNLP triton_serving sample equivalent")]
    plan += fp32_variants() if run.cfg.variants else fp32_variants()[:1]
    for config in plan:
        run.configs[config.name] = run.serve(config)
    return plan


def _winner_options(run: _Run) -> tuple[str | None, ServingOptions]:
    winner = pick_winner(run.configs)
    run.results["fp32_winner"] = winner
    options = run.configs[winner]["options"] if winner else ServingOptions().to_dict()
    chosen = ServingOptions(**{**options, "buckets": tuple(options["buckets"])})
    log.info("bench: fp32 winner %s — fp32-fused and int8 served with its options", winner)
    return winner, chosen


def _serve_optimised(run: _Run, winner: str | None, chosen: ServingOptions) -> None:
    """fp32-fused, int8 and (where the host runs it) bf16 with the winner's options; int8's server (fp32-fused's if
    int8 failed its gate) also hot-reloads under load, as before bf16 was benched."""
    optimised = [p for p in OPTIMISED if p in run.results["releases"]]
    last = [p for p in ("fp32-fused", "int8") if run.results["releases"].get(p, {}).get("gate_passed")]
    for profile in optimised:
        config = ServingConfig(profile, profile, chosen, "main", f"options of {winner}")
        reload_to = None
        if last and profile == last[-1]:
            reload_to = next((p for p in ("fp32-fused", "fp32") if p != profile), "fp32")
        run.configs[profile] = run.serve(config, hot_reload_profile=reload_to)
        if reload_to and "hot_reload" in run.configs[profile]:
            run.results["hot_reload"] = run.configs[profile].pop("hot_reload")


def _head_to_head(run: _Run, plan: list[ServingConfig], winner: str | None, chosen: ServingOptions) -> None:
    """classic, the fp32 winner and the served optimised profiles, if classic was measured."""
    contenders = [plan[0]]
    contenders += [c for c in plan if c.name == winner]
    contenders += [
        ServingConfig(p, p, chosen, "main", f"options of {winner}")
        for p in OPTIMISED
        if run.configs.get(p, {}).get("cells")
    ]
    if run.cfg.quick:  # same code path, fewer servers to start
        contenders = contenders[:2]
    if len(contenders) > 1 and run.configs.get("classic", {}).get("cells"):
        run.results["head_to_head"] = head_to_head(
            contenders, run.checkpoint, run.home, run.work, run.corpus, run.cfg.budget, run.cfg.keep_work
        )


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the whole benchmark; writes ``results.json``, ``results.md`` and ``plot.png`` to
    ``cfg.out`` and returns the results (with ``ratios``)."""
    from seqcls_tools.bench import report

    assert cfg.spec is not None and cfg.budget is not None
    t_start = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    work = cfg.out / "work"
    results: dict[str, Any] = {"meta": _meta(cfg)}
    try:
        run = _prepare(cfg, work, work / "home", results)
        plan = _serve_fp32(run)
        winner, chosen = _winner_options(run)
        _serve_optimised(run, winner, chosen)
        _head_to_head(run, plan, winner, chosen)
    finally:
        if not cfg.keep_work:
            shutil.rmtree(work, ignore_errors=True)
        results["meta"]["loadavg_end"] = loadavg()
        results["meta"]["seconds"] = round(time.perf_counter() - t_start, 1)
        results["meta"]["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    if "roofline" in results:
        results["roofline"]["profiles"] = [asdict(row) for row in roofline.profile_rows(results)]
    results["conditions"] = conditions.sections(results)
    results["ratios"] = report.ratios(results)
    report.write_all(results, cfg.out)
    return results
