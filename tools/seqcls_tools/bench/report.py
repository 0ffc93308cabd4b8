"""Benchmark output: ``results.json``, a Markdown report, a PNG plot, and the ratios vs the targets.

The ratios are computed in :mod:`~seqcls_tools.bench.ratios`, the report written by
:mod:`~seqcls_tools.bench.markdown`; this module writes the files (and draws the plot).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seqcls_tools.bench.markdown import markdown, ratio_lines
from seqcls_tools.bench.ratios import EXACT_PROFILES, TARGETS, cell_value, ratios

__all__ = ["EXACT_PROFILES", "TARGETS", "cell_value", "markdown", "plot", "ratio_lines", "ratios", "write_all"]


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for name, entry in results.get("configs", {}).items():
        cells = sorted((c for c in entry.get("cells", []) if c["texts_per_request"] == 1), key=lambda c: c["clients"])
        if not cells:
            continue
        style = "--" if entry.get("group") == "variant" else "-"
        width = 2.2 if entry.get("group") != "variant" else 1.2
        xs = [c["clients"] for c in cells]
        axes[0].plot(xs, [c["sentences_per_s"] for c in cells], style, marker="o", lw=width, label=name)
        axes[1].plot(xs, [c["p95_ms"] for c in cells], style, marker="o", lw=width, label=name)
    axes[0].set_title("throughput, single-text requests")
    axes[0].set_ylabel("sentences / s")
    axes[1].set_title("p95 latency, single-text requests")
    axes[1].set_ylabel("ms")
    for ax in axes:
        ax.set_xlabel("concurrent clients")
        ax.set_xticks(results.get("meta", {}).get("clients", [1, 4, 8]))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    meta = results.get("meta", {})
    fig.suptitle(
        f"seqcls serving profiles ({meta.get('mode')}, {results.get('model', {}).get('spec', {}).get('name')}); "
        f"load avg {meta.get('loadavg_start')} → {meta.get('loadavg_end')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_all(results: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "plot": out / "plot.png"}
    paths["json"].write_text(json.dumps(results, indent=1, ensure_ascii=False, default=str), encoding="utf-8")
    paths["markdown"].write_text(markdown(results), encoding="utf-8")
    plot(results, paths["plot"])
    return paths
