"""Is the server up? HTTP liveness/readiness probes, and why startup failed, read from its log.

``tritonclient`` is imported inside the functions: importing seqcls stays cheap for DAG parsing.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from seqcls.errors import ServingError
from seqcls.localtriton.process import Process, exit_code, process_alive

#: Log lines worth quoting when startup fails (Triton's E-lines, getopt complaints).
_SALIENT_RE = re.compile(r"^E\d{4} |unrecognized option|invalid argument|error:|failed to", re.IGNORECASE)
#: Printed on every CPU-only host; not the reason anything failed.
_NOISE_RE = re.compile(r"CudaDriverHelper|CUDA driver version is insufficient|pinned memory pool")


def tail(path: Path, n: int) -> str:
    """Last ``n`` lines of a possibly large log without reading all of it."""
    if n <= 0 or not path.is_file():
        return ""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        block, data = 8192, b""
        pos = end
        while pos > 0 and data.count(b"\n") <= n:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-n:])


def _startup_failure_summary(log_path: Path | None, secret: str | None = None) -> str:
    """Why startup failed, from the log: salient lines first (a bad flag is followed by ~400
    lines of usage text), then the tail; plus a port hint for a busy port. Triton echoes a rejected
    flag's value, so ``secret`` (the control key) is masked."""
    if log_path is None or not log_path.is_file():
        return ""
    with log_path.open("rb") as f:
        head = f.read(1 << 20).decode("utf-8", errors="replace").splitlines()
    salient = [ln for ln in head if _SALIENT_RE.search(ln) and not _NOISE_RE.search(ln)][:10]
    text = ""
    match = re.search(r"Socket '([^']+)' already in use", "\n".join(head))
    if match:
        text += f" (port {match.group(1).rsplit(':', 1)[-1]} is already in use)"
    text += f"; log {log_path}"
    if salient:
        text += ", errors:\n" + "\n".join(salient) + "\nlast lines:\n" + tail(log_path, 10)
    else:
        text += ", last lines:\n" + tail(log_path, 30)
    return text.replace(secret, "***") if secret else text


def wait_until_live(
    http_url: str,
    timeout: float = 60.0,
    *,
    process: Process | None = None,
    log_path: Path | None = None,
    interval: float = 0.1,
    secret: str | None = None,
) -> float:
    """Poll ``/v2/health/live`` until it answers; returns seconds waited.

    Fails fast, with the log tail, when ``process`` exits meanwhile: a server that died on a bad
    flag or a busy port should not cost the full timeout.
    """
    import tritonclient.http as httpclient  # lazy: keeps `import seqcls` cheap for DAG parsing

    start = time.monotonic()
    deadline = start + timeout
    client = httpclient.InferenceServerClient(url=http_url, connection_timeout=1.0, network_timeout=2.0)
    try:
        while True:
            if process is not None and not process_alive(process):
                raise ServingError(
                    f"tritonserver exited with code {exit_code(process)} during startup"
                    + _startup_failure_summary(log_path, secret)
                )
            try:
                if client.is_server_live():
                    return time.monotonic() - start
            except Exception:  # connection refused/reset while it starts: keep polling
                pass
            if time.monotonic() >= deadline:
                summary = _startup_failure_summary(log_path, secret)
                raise ServingError(f"Triton at {http_url} was not live after {timeout:g} s" + summary)
            time.sleep(interval)
    finally:
        client.close()


def probe(http_url: str) -> tuple[bool, bool, str | None]:
    """(live, ready, version) over HTTP with short timeouts; False/None on any error."""
    import tritonclient.http as httpclient

    live = ready = False
    version: str | None = None
    client = httpclient.InferenceServerClient(url=http_url, connection_timeout=1.0, network_timeout=2.0)
    try:
        with contextlib.suppress(Exception):
            live = bool(client.is_server_live())
        if live:
            with contextlib.suppress(Exception):
                ready = bool(client.is_server_ready())
            with contextlib.suppress(Exception):
                version = str(client.get_server_metadata().get("version")) or None
    finally:
        client.close()
    return live, ready, version
