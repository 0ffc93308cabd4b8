"""How long a base-size release's export, convert and validate take, per serving profile.

A scheduled retraining release waits for these steps, so their time on the serving host is a
product figure, not a curiosity. This builds randomly initialised base-size checkpoints (ERNIE
3.0 base's shape; DeBERTa-v2 base's for the Hugging Face path), then runs the real ``seqcls``
CLI steps one process each, exactly as Airflow's tasks would, in a fresh home per profile:

    .venv/bin/python -m seqcls_tools.bench.release_time                      # ERNIE base, every profile here
    .venv/bin/python -m seqcls_tools.bench.release_time --arch deberta-v2 --profiles int8

It prints one row per profile (export, convert, validate, convert + validate, in seconds) and
every step's log lines with their offsets, so the sub-step that dominates can be read off.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqcls_tools.bench.corpus import make_corpus, make_labels
from seqcls_tools.bench.machine import isa_text, loadavg, machine_facts
from seqcls_tools.bench.model import BASE, build_checkpoint
from seqcls_tools.bench.plan import host_profiles

# the CLI's two log formats: structlog's ISO stamp and the stdlib formatter's ``[date time,ms]``
_STAMP = re.compile(r"^\[?(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)[.,](\d+)Z?\]?")


@dataclass
class StepTime:
    step: str
    seconds: float
    log: list[tuple[float, str]] = field(default_factory=list)  # (offset s, message)


def _build(arch: str, out: Path) -> Path:
    """The base-size checkpoint for ``arch`` in ``out`` (kept and reused when present)."""
    done = out / ".built"
    if done.is_file():
        return out
    corpus = make_corpus(2000, seed=0)
    labels = make_labels(BASE.num_labels)
    if arch == "ernie":
        build_checkpoint(out, BASE, corpus, labels, golden=corpus[-32:], seed=0)
    else:
        from seqcls_tools.testing_hf import build_tiny_hf_checkpoint

        build_tiny_hf_checkpoint(
            out,
            architecture=arch,
            labels=labels,
            hidden_size=768,
            num_layers=12,
            num_heads=12,
            max_position=512,
            corpus=corpus,
            golden=corpus[-32:],
            logit_scale=20.0,
            vocab_size=21128,
        )
    done.write_text("ok\n")
    return out


def log_lines(text: str) -> list[tuple[float, str]]:
    """The stamped lines of a CLI run as (seconds since the first, message without level/location)."""
    lines: list[tuple[float, str]] = []
    start: float | None = None
    for line in text.splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        at = time.mktime(time.strptime(f"{m.group(1)} {m.group(2)}", "%Y-%m-%d %H:%M:%S")) + float("0." + m.group(3))
        start = at if start is None else start
        message = line[m.end() :].strip()
        message = re.sub(r"\s+\[seqcls[^\]]*\].*$", "", message)  # structlog's logger/location suffix
        message = re.sub(r"^\[\s*\w+\]\s+\S+:\d+ - ", "", message)  # the stdlib formatter's level/location
        lines.append((round(at - start, 1), message[:200]))
    return lines


def _run(step: str, args: list[str], env: dict[str, str]) -> StepTime:
    cmd = [sys.executable, "-m", "seqcls.cli", step, *args]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"`seqcls {step}` failed ({out.returncode}):\n{out.stderr[-4000:]}")
    lines = log_lines(out.stdout + out.stderr)
    return StepTime(step, round(seconds, 1), lines)


def measure(arch: str, profiles: list[str], work: Path) -> dict[str, Any]:
    """Build (or reuse) the checkpoint, then export + convert + validate per profile in a fresh home."""
    t0 = time.perf_counter()
    checkpoint = _build(arch, work / f"checkpoint-{arch}")
    built = round(time.perf_counter() - t0, 1)
    results: dict[str, Any] = {"arch": arch, "checkpoint_build_seconds": built, "profiles": {}}
    for profile in profiles:
        home = work / f"home-{arch}-{profile}"
        shutil.rmtree(home, ignore_errors=True)  # a kept workspace would make every step a no-op
        env = {**os.environ, "SEQCLS_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        common = ["--checkpoint", str(checkpoint), "--profile", profile]
        steps = [
            _run("export", common, env),
            _run("convert", common, env),
            _run("validate", common, env),
        ]
        results["profiles"][profile] = {s.step: s.seconds for s in steps} | {
            "convert+validate": round(steps[1].seconds + steps[2].seconds, 1),
            "logs": {s.step: s.log for s in steps},
        }
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seqcls_tools.bench.release_time", description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=("ernie", "deberta-v2", "bert"), default="ernie")
    p.add_argument("--profiles", help="comma-separated (default: every profile this host runs, bf16 included)")
    p.add_argument("--work", type=Path, help="keep checkpoints and homes here (the checkpoint is reused)")
    p.add_argument("--json", type=Path, help="also write the figures and logs here")
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="seqcls-release-time-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.profiles:
        profiles = [x.strip() for x in args.profiles.split(",") if x.strip()]
    else:
        profiles, left_out = host_profiles()
        for profile, why in left_out.items():
            print(f"{profile} left out: {why}")
    result = measure(args.arch, profiles, work)
    result["cpu"] = _cpu()
    print(f"{args.arch} base shape; checkpoint ready in {result['checkpoint_build_seconds']} s; {result['cpu']}")
    print(f"{'profile':<12}{'export s':>10}{'convert s':>11}{'validate s':>12}{'conv+val s':>12}")
    for profile, r in result["profiles"].items():
        print(f"{profile:<12}{r['export']:>10}{r['convert']:>11}{r['validate']:>12}{r['convert+validate']:>12}")
    for profile, r in result["profiles"].items():
        for step, lines in r["logs"].items():
            print(f"\n--- {profile} {step} ---")
            for offset, message in lines:
                print(f"{offset:>7.1f}  {message}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


def _cpu() -> str:
    facts = machine_facts()
    return f"{facts['cpu_model']}, {facts['cpus_usable']} CPUs usable ({isa_text(facts['isa'])}), loadavg {loadavg()}"


if __name__ == "__main__":
    raise SystemExit(main())
