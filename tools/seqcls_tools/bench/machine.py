"""Facts about the machine a benchmark ran on: CPU, instruction sets, library versions, load average."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any


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
