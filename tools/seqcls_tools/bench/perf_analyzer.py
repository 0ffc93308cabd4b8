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
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from seqcls.errors import InputError
from seqcls.serving.names import ENSEMBLE
from seqcls_tools.bench import measure

#: where ``make setup-perf`` installs it, beside the running venv
DEFAULT_DIR = Path(sys.prefix) / "perf-analyzer"


def _env(binary: Path) -> dict[str, str]:
    """The binary's environment: the CUDA runtime library of its install directory on the loader path."""
    libs = [str(p) for p in (binary.parent.parent / "nvidia" / "cuda_runtime" / "lib",) if p.is_dir()]
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join([*libs, os.environ.get("LD_LIBRARY_PATH", "")])}


def find_binary(given: str | None = None) -> Path | None:
    """``given``, else ``$SEQCLS_PERF_ANALYZER``, else ``make setup-perf``'s — None when there is none;
    one that is there but does not start (a library missing) is an error saying what to install."""
    name = given or os.environ.get("SEQCLS_PERF_ANALYZER")
    path = Path(name) if name else DEFAULT_DIR / "bin" / "perf_analyzer"
    if not path.is_file():
        if name:
            raise InputError(f"perf_analyzer {path}: no such file (SEQCLS_PERF_ANALYZER / --perf-analyzer)")
        return None
    proc = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30, env=_env(path))
    if "error while loading shared libraries" in proc.stderr:
        raise InputError(
            f"{path} does not start: {proc.stderr.strip()[:300]} — libb64: `bash scripts/system-deps.sh` "
            "(Debian libb64-0d); libcudart: `make setup-perf`"
        )
    return path


def input_data(texts: list[str], path: Path) -> Path:
    """perf_analyzer's ``--input-data``: one single-text request per entry, sent in turn."""
    data = [{"TEXT": {"content": [t], "shape": [1]}} for t in texts]
    path.write_text(json.dumps({"data": data}, ensure_ascii=False), encoding="utf-8")
    return path


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def pa_cell(binary: Path, server, clients: int, window_seconds: float, data: Path, work: Path) -> dict[str, Any]:
    """One perf_analyzer run at ``clients`` concurrent single-text requests (three windows of
    ``window_seconds``): its rate and latencies, its own CPU and the server's (Triton + stubs);
    ``error`` instead when it failed."""
    out = work / f"pa-{clients}.csv"
    cmd = [str(binary), "-m", ENSEMBLE, "-i", "grpc", "-u", server.config.grpc_url]
    cmd += ["--concurrency-range", f"{clients}:{clients}", "--input-data", str(data), "-f", str(out)]
    cmd += ["--measurement-interval", str(max(int(window_seconds * 1000), 100))]
    # three windows, always accepted: the interleaved rounds and their medians deal with the noise
    cmd += ["--stability-percentage", "1000", "--max-trials", "3"]
    pid = server.status().pid
    snap0, cpu0 = measure.ProcessSnapshot.take(pid), _children_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=window_seconds * 6 + 60, env=_env(binary))
    cpu1, snap1 = _children_cpu(), measure.ProcessSnapshot.take(pid)
    wall = snap1.taken - snap0.taken
    if proc.returncode != 0 or not out.is_file():
        return {"clients": clients, "error": (proc.stderr or proc.stdout).strip()[-400:]}
    row = next(csv.DictReader(out.open(encoding="utf-8")))
    cores = measure.cpu_between(snap0, snap1)
    rate, client = float(row["Inferences/Second"]), (cpu1 - cpu0) / max(wall, 1e-9)
    return {
        "clients": clients,
        "sentences_per_s": round(rate, 2),
        "p50_ms": round(float(row["p50 latency"]) / 1000, 2),
        "p95_ms": round(float(row["p95 latency"]) / 1000, 2),
        # perf_analyzer's CPU over its whole run (stabilising windows included) / the run's wall time
        "client_cores": round(client, 3),
        "server_cores": cores["total"],
        "cpu_ms_per_sentence": round(1000.0 * (cores["total"] + client) / rate, 2) if rate else None,
    }
