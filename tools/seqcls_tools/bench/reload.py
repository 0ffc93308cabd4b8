"""Hot reload under load: another release published and loaded while clients keep sending."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seqcls.errors import SeqclsError
from seqcls.release.records import Published
from seqcls_tools.bench import measure
from seqcls_tools.bench.plan import Budget, ServingConfig
from seqcls_tools.bench.profiles import bench_release, bench_settings, serve_release

log = logging.getLogger("seqcls_tools.bench")
LOADED = re.compile(r"loaded (\S+) in ([0-9.]+)s")


class LoadLog(logging.Handler):
    """The per-model load times :mod:`seqcls.serving.client` logs (``loaded <model> in N s``), each with
    the seconds since this log started, while it is attached (:func:`load_log`)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.t0 = time.perf_counter()
        self.loads: list[tuple[float, str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = LOADED.search(record.getMessage())
        if m:
            self.loads.append((round(time.perf_counter() - self.t0, 2), m.group(1), float(m.group(2))))


@contextlib.contextmanager
def load_log() -> Iterator[LoadLog]:
    client = logging.getLogger("seqcls.serving.client")
    handler, level = LoadLog(), client.level
    client.addHandler(handler)
    if not client.isEnabledFor(logging.INFO):
        client.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        client.removeHandler(handler)
        client.setLevel(level)


def hot_reload(
    server, checkpoint: Path, home: Path, config: ServingConfig, other_profile: str, texts: list[str], budget: Budget
) -> dict[str, Any]:
    """Take another release to serving (:func:`serving_steps`) while 4 clients keep sending single-text requests."""
    settings = bench_settings(home, server)
    other = bench_release(checkpoint, other_profile, settings)
    stop = threading.Event()
    box: dict[str, Any] = {}

    def load() -> None:
        box["result"] = measure.run_load(
            server.config.grpc_url,
            texts,
            clients=4,
            texts_per_request=1,
            max_requests=10**9,
            max_seconds=budget.reload_load_seconds,
            stop=stop,
        )

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    error, loads = None, None
    try:
        time.sleep(1.0)
        t0 = time.perf_counter()
        with load_log() as loads:
            done = serve_release(other, config.options)
        pub, rel = done["publish"], done["reload"]
        switch_seconds = time.perf_counter() - t0
        time.sleep(1.0)
    except SeqclsError as exc:
        error = str(exc)[:400]
        pub = rel = None
        switch_seconds = None
    finally:
        stop.set()
        thread.join()
    result: measure.LoadResult = box["result"]
    out = {
        "from_profile": config.profile,
        "to_profile": other_profile,
        "to_version": Published.load(other.workspace).version if pub else None,
        "publish_seconds": round(pub.seconds, 2) if pub else None,
        "reload_seconds": rel.summary.get("seconds") if rel else None,
        "publish_and_reload_seconds": round(switch_seconds, 2) if switch_seconds is not None else None,
        "requests": result.requests,
        "failed": result.failed,
        "errors": result.errors[:3],
        "load_seconds": round(result.seconds, 2),
        # (seconds since the switch began, Triton model, seconds its load call took), in order
        "model_loads": loads.loads if loads is not None else [],
        **measure.percentiles(result.latencies_ms),
        "error": error,
    }
    log.info(
        "bench: hot reload %s → %s under load: reload %.1fs (%s), %d requests, %d failed",
        config.profile,
        other_profile,
        out["reload_seconds"] or -1,
        ", ".join(f"{m} {s:.1f}s" for _, m, s in out["model_loads"]) or "no loads logged",
        out["requests"],
        out["failed"],
    )
    return out
