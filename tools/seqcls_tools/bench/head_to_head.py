"""Head-to-head: every contender's server up at once, the headline cells interleaved over a few rounds,
each cell driven by perf_analyzer (Triton's load generator, when installed) and by the Python client.

Slow changes in the machine's other load hit all contenders alike, so the ratios use these medians
rather than the sequential measurements of the serving matrix.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from seqcls_tools.bench.perf_analyzer import find_binary, input_data, pa_cell
from seqcls_tools.bench.plan import CLIENTS, Budget, ServingConfig
from seqcls_tools.bench.profiles import bench_release, bench_settings, serve_release
from seqcls_tools.bench.serving import BenchServer, cell, one_per_length, release_lengths, warm_up

log = logging.getLogger("seqcls_tools.bench")


def _start_all(
    stack: contextlib.ExitStack,
    plan: list[ServingConfig],
    checkpoint: Path,
    home: Path,
    work: Path,
    texts: list[str],
    budget: Budget,
    keep: bool,
) -> dict[str, Any]:
    """One served, warmed-up server per contender (stopped when ``stack`` closes); name → server."""
    servers = {}
    for i, config in enumerate(plan):
        server = stack.enter_context(BenchServer(work, 100 + i, keep, state=f"state-h2h-{i}"))
        release = bench_release(checkpoint, config.profile, bench_settings(home, server))
        serve_release(release, config.options)
        warm_up(server, texts, budget, one_per_length(texts, release_lengths(release, texts)))
        servers[config.name] = server
    return servers


def _interleaved_rounds(
    servers: dict[str, Any], texts: list[str], budget: Budget, configs: dict[str, Any], pa: Path | None, tmp: Path
) -> None:
    """A B C D, A B C D, ...: 8 clients then 1 client per round, each cell by perf_analyzer (when
    installed) and then the Python client; cells appended to ``configs[name]``."""
    cell_budget = replace(budget, cell_seconds=budget.h2h_seconds)
    data = input_data(texts, tmp / "texts.json", max(CLIENTS)) if pa else None
    offset = 0
    for r in range(budget.h2h_rounds):
        for clients in (max(CLIENTS), 1):
            for name, server in servers.items():
                if pa and data is not None:
                    pa_result = {"round": r, **pa_cell(pa, server, clients, budget.h2h_seconds / 2, data, tmp)}
                    configs[name]["perf_analyzer"].append(pa_result)
                    log.info(
                        "bench: head-to-head round %d %-22s %d client(s), perf_analyzer: %s",
                        r + 1,
                        name,
                        clients,
                        pa_result,
                    )
                result = cell(server, texts, clients, 1, cell_budget, offset)
                offset += result["texts"] + 3
                result["round"] = r
                configs[name]["cells"].append(result)
                log.info(
                    "bench: head-to-head round %d %-22s %d client(s): %7.1f sentences/s, p95 %s ms",
                    r + 1,
                    name,
                    clients,
                    result["sentences_per_s"],
                    result["p95_ms"],
                )


def _medians(entry: dict[str, Any]) -> None:
    import numpy as np

    def median(cells: list[dict[str, Any]], clients: int, key: str) -> tuple[float | None, list[float]]:
        values = [c[key] for c in cells if c["clients"] == clients and c.get(key) is not None]
        digits = 3 if key == "client_cores" else 2  # a load generator's 0.004 cores is not 0.0
        return (round(float(np.median(values)), digits) if values else None), values

    for clients, key in ((max(CLIENTS), "sentences_per_s"), (1, "p95_ms"), (max(CLIENTS), "cpu_ms_per_sentence")):
        entry[f"median_{clients}c_{key}"], entry[f"all_{clients}c_{key}"] = median(entry["cells"], clients, key)
    for clients, key in ((max(CLIENTS), "sentences_per_s"), (1, "p95_ms"), (max(CLIENTS), "client_cores")):
        entry[f"pa_median_{clients}c_{key}"], _ = median(entry.get("perf_analyzer", []), clients, key)


def head_to_head(
    plan: list[ServingConfig], checkpoint: Path, home: Path, work: Path, texts: list[str], budget: Budget, keep: bool
) -> dict[str, Any]:
    """The headline cells again, with every contender's server up at once and the cells
    interleaved (A B C D, A B C D, ...), so slow changes in the machine's other load hit all of
    them alike. Idle servers use no CPU. Ratios are computed from the medians of these rounds."""
    pa = find_binary()
    out: dict[str, Any] = {"rounds": budget.h2h_rounds, "seconds_per_cell": budget.h2h_seconds, "configs": {}}
    out["perf_analyzer"] = str(pa) if pa else None
    if not pa:
        log.warning("bench: no perf_analyzer (make setup-perf) — the head-to-head is the Python client's alone")
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="seqcls-h2h-") as tmp:
        servers = _start_all(stack, plan, checkpoint, home, work, texts, budget, keep)
        out["configs"] = {name: {"cells": [], "perf_analyzer": []} for name in servers}
        log.info("bench: head-to-head — %s up, %d interleaved rounds", ", ".join(servers), budget.h2h_rounds)
        _interleaved_rounds(servers, texts, budget, out["configs"], pa, Path(tmp))
    for entry in out["configs"].values():
        _medians(entry)
    return out
