"""perf_analyzer — Triton's own load generator — for the benchmark's headline cells.

Its numbers are the ones Triton users compare, and its client is C++: on a 2-core machine the load
generator's own CPU competes with the server it measures, so every cell reports it separately. The
binary is not on the venv's path: ``make setup-perf`` installs tritonclient 2.41's build (PyPI's
``perf-analyzer`` 2.60 needs glibc 2.38) and the ``libcudart.so.12`` it loads into
``<venv>/perf-analyzer`` (``requirements-perf.txt``); ``libb64`` comes from the system.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from seqcls.contract.names import ENSEMBLE
from seqcls.errors import InputError
from seqcls_tools.bench import measure

log = logging.getLogger(__name__)

#: where ``make setup-perf`` installs it, beside the running venv
DEFAULT_DIR = Path(sys.prefix) / "perf-analyzer"


def _env(binary: Path) -> dict[str, str]:
    """The binary's environment: the CUDA runtime library of its install directory on the loader path."""
    lib = binary.parent.parent / "nvidia" / "cuda_runtime" / "lib"
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join([str(lib), os.environ.get("LD_LIBRARY_PATH", "")])}


def find_binary(given: str | None = None) -> Path | None:
    """``given``, else ``$SEQCLS_PERF_ANALYZER``, else ``make setup-perf``'s — None when there is none;
    one that is there but does not start (a library missing) is an error saying what to install."""
    name = given or os.environ.get("SEQCLS_PERF_ANALYZER")
    path = Path(name) if name else DEFAULT_DIR / "bin" / "perf_analyzer"
    if not path.is_file():
        if name:
            raise InputError(f"perf_analyzer {path}: no such file (SEQCLS_PERF_ANALYZER)")
        return None
    proc = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30, env=_env(path))
    if "error while loading shared libraries" in proc.stderr:
        raise InputError(
            f"{path} does not start: {proc.stderr.strip()[:300]} — libb64: `bash scripts/system-deps.sh` "
            "(Debian libb64-0d); libcudart: `make setup-perf`"
        )
    return path


def input_data(texts: list[str], path: Path, clients: int = 1) -> list[Path]:
    """perf_analyzer's ``--input-data``, one file per client: single-text requests sent in turn, the
    k-th client's list rotated by ``k / clients`` of the texts so no two send the same text at once."""
    files = []
    for k in range(clients):
        shift = k * len(texts) // max(clients, 1)
        data = [{"TEXT": {"content": [t], "shape": [1]}} for t in texts[shift:] + texts[:shift]]
        files.append(path.with_name(f"{path.stem}-{k}{path.suffix}"))
        files[-1].write_text(json.dumps({"data": data}, ensure_ascii=False), encoding="utf-8")
    return files


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def pa_cell(binary: Path, server, clients: int, window_seconds: float, data: list[Path], work: Path) -> dict[str, Any]:
    """``clients`` perf_analyzer processes at concurrency 1 each (three windows of ``window_seconds``, ≥ 1 s),
    each with its own rotation of the texts (``data``: :func:`input_data`): one process at concurrency
    N sends the same text from several contexts at once here (tritonclient 2.41's build), which the
    server merges into one run — a stream no user sends. Rate: the processes' sum; p50/p95: the
    largest; the processes' own CPU and the server's (Triton + stubs); ``error`` when one failed."""
    cmds, outs = [], []
    for k in range(clients):
        outs.append(work / f"pa-{clients}-{k}.csv")
        cmd = [str(binary), "-m", ENSEMBLE, "-i", "grpc", "-u", server.config.grpc_url, "--concurrency-range", "1:1"]
        cmd += ["--input-data", str(data[k % len(data)]), "-f", str(outs[-1])]
        cmd += ["--measurement-interval", str(max(int(window_seconds * 1000), 1000))]
        # three windows, any spread accepted (the interleaved rounds' medians deal with the noise); a
        # window with no answer at all (a short one on a busy machine) never counts, so more trials
        cmds.append([*cmd, "--stability-percentage", "1000", "--max-trials", "6"])
    pid = server.status().pid
    snap0, cpu0 = measure.ProcessSnapshot.take(pid), _children_cpu()
    procs = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(binary)) for c in cmds
    ]
    logs = [p.communicate(timeout=max(window_seconds, 1.0) * 8 + 60)[0] for p in procs]
    cpu1, snap1 = _children_cpu(), measure.ProcessSnapshot.take(pid)
    wall = snap1.taken - snap0.taken
    failed = [log for p, log, out in zip(procs, logs, outs, strict=True) if p.returncode != 0 or not out.is_file()]
    if failed:
        return {"clients": clients, "error": failed[0].strip()[-400:]}
    rows = [next(csv.DictReader(out.open(encoding="utf-8"))) for out in outs]
    cores = measure.cpu_between(snap0, snap1)
    rate, client = sum(float(r["Inferences/Second"]) for r in rows), (cpu1 - cpu0) / max(wall, 1e-9)
    return {
        "clients": clients,
        "sentences_per_s": round(rate, 2),
        "p50_ms": round(max(float(r["p50 latency"]) for r in rows) / 1000, 2),
        "p95_ms": round(max(float(r["p95 latency"]) for r in rows) / 1000, 2),
        # perf_analyzer's CPU over its whole run (stabilising windows included) / the run's wall time
        "client_cores": round(client, 3),
        "server_cores": cores["total"],
        "cpu_ms_per_sentence": round(1000.0 * (cores["total"] + client) / rate, 2) if rate else None,
    }


def lone_p50(binary: Path, url: str, model: str, data: Path, work: Path, window_seconds: float = 3.0) -> float | None:
    """p50 ms of one perf_analyzer process at concurrency 1 on ``model`` (three windows of ``window_seconds``,
    texts in turn from ``data``): a lone request with a C++ client, whose own cost per request is a fraction
    of the Python client's. None when perf_analyzer failed (its output is logged)."""
    out = work / f"pa-lone-{model}.csv"
    cmd = [str(binary), "-m", model, "-i", "grpc", "-u", url, "--concurrency-range", "1:1"]
    window = str(max(int(window_seconds * 1000), 1000))
    cmd += ["--input-data", str(data), "-f", str(out), "--measurement-interval", window]
    cmd += ["--stability-percentage", "1000", "--max-trials", "3"]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=window_seconds * 8 + 60, env=_env(binary), check=False
    )
    if proc.returncode != 0 or not out.is_file():
        log.warning("perf_analyzer on %s failed (exit %s): %s", model, proc.returncode, proc.stdout.strip()[-400:])
        return None
    row = next(csv.DictReader(out.open(encoding="utf-8")))
    return round(float(row["p50 latency"]) / 1000, 4)
