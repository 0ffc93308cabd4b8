"""``seqcls bench``: every serving profile side by side on a real local Triton, in one run.

Profiles: ``classic`` (the PaddleNLP ``triton_serving`` sample rendered by our renderer:
paddlenlp tokenizer, no dynamic batching, ORT ``basic``, one instance, per-request), ``fp32``
with the default CPU options plus variants (batching strategies, padding, instances × threads),
``fp32-fused``, ``int8`` and, where the host runs it, ``bf16`` (served with the winning fp32
options). Measured in one run: the host's roofline (:mod:`.roofline`: bandwidth and matrix peaks;
every profile's rates are reported as a fraction of it); the in-process limit (HF tokenizer + ONNX
Runtime, no server) per batch size; each configuration at 1/4/8 clients with single-text and
8-text requests (sentences/s, p50/p95/p99, Triton's executed batch sizes, CPU and RSS of server
and python stubs); a lone request's time per part (sequential single-text requests split by
Triton's statistics per composing model, beside the same work in process); tokenizer throughput
(HF vs paddlenlp); a hot reload under load; the release steps' timings. Every table of the report
names its conditions (CPU and flags, threads, batch and request shape, token lengths, load
generator). Output: ``results.json``, ``results.md``, ``plot.png`` in ``--out`` and the ratios
against the issue's targets, printed last.

``--quick`` runs the same code on a tiny model with tiny budgets (about a minute, for CI);
the full run builds the ERNIE-3.0-medium-shaped model and takes about 20 minutes on 2 cores.
Python API: :func:`run_bench` with a :class:`BenchConfig`.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seqcls_tools.bench.run import BenchConfig, run_bench

__all__ = ["BenchConfig", "add_arguments", "format_summary", "run_bench", "run_from_args"]

log = logging.getLogger("seqcls_tools.bench")


def __getattr__(name: str) -> Any:
    # The harness itself loads on first use: building the ``seqcls`` parser (add_arguments) must
    # not import the whole benchmark.
    if name in ("BenchConfig", "run_bench"):
        from seqcls_tools.bench import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny model, tiny budgets (about a minute; for CI)")
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: <home>/bench/<UTC timestamp>)"
    )
    parser.add_argument("--seed", type=int, default=0, help="corpus and model seed")
    parser.add_argument(
        "--variants",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also serve the fp32 variants (batching strategies, instances x threads); default on, off with --quick",
    )
    parser.add_argument("--keep-work", action="store_true", help="keep checkpoint, releases and repositories")
    parser.add_argument("--json", action="store_true", help="print results.json instead of the Markdown report")
    parser.add_argument(
        "--strict", action="store_true", help="exit 4 when a target is missed (default: 0 whenever the run completed)"
    )


def _default_out(home: Path | None) -> Path:
    from seqcls.settings import Settings

    return Settings.from_env(home=home).home / "bench" / datetime.now().strftime("%Y%m%d-%H%M%S")


def format_summary(results: dict[str, Any], out: Path) -> str:
    """What ``seqcls bench`` prints: the Markdown report, where the files are, the ratios last."""
    from seqcls_tools.bench import report

    lines = [report.markdown(results).split("\n## Ratios vs targets")[0].rstrip(), ""]
    lines += [f"files: {out / 'results.json'}, {out / 'results.md'}, {out / 'plot.png'}", ""]
    lines += ["ratios vs targets:", *report.ratio_lines(results.get("ratios", []))]
    return "\n".join(lines)


def run_from_args(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    import json

    from seqcls_tools.bench.run import BenchConfig, run_bench

    os.environ.setdefault("GLOG_minloglevel", "2")
    os.environ.setdefault("FLAGS_call_stack_level", "0")
    out = args.out or _default_out(getattr(args, "home", None))
    cfg = BenchConfig(out=out, quick=args.quick, seed=args.seed, keep_work=args.keep_work, variants=args.variants)
    log.info("bench: %s run, results in %s", "quick" if cfg.quick else "full", out)
    results = run_bench(cfg)
    missed = [r for r in results.get("ratios", []) if not r["passed"]]
    code = 4 if args.strict and missed else 0

    def show() -> None:
        if args.json:
            print(json.dumps(results, indent=1, ensure_ascii=False, default=str))
        else:
            print(format_summary(results, out))

    return code, show
