"""Facts about the machine a benchmark ran on: CPU, instruction sets, library versions, load average."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any

#: The CPU flags speed depends on: AVX2/AVX-512 GEMMs, VNNI int8 dot products, bf16 and AMX tiles.
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


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
        "isa": {f: f in flags for f in ISA_FLAGS},
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def isa_text(isa: dict[str, bool]) -> str:
    """``avx2 yes, ..., amx_int8 absent``: every flag named, the missing ones too."""
    return ", ".join(f"{flag} {'yes' if present else 'absent'}" for flag, present in isa.items())
