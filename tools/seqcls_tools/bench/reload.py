"""Hot reload under load: another release published and loaded while clients keep sending."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from seqcls.errors import SeqclsError
from seqcls.records import Published
from seqcls_tools.bench import measure
from seqcls_tools.bench.plan import Budget, ServingConfig
from seqcls_tools.bench.profiles import bench_release, bench_settings, serve_release

log = logging.getLogger("seqcls_tools.bench")


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
    error = None
    try:
        time.sleep(1.0)
        t0 = time.perf_counter()
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
        **measure.percentiles(result.latencies_ms),
        "error": error,
    }
    log.info(
        "bench: hot reload %s → %s under load: reload %.1fs, %d requests, %d failed",
        config.profile,
        other_profile,
        out["reload_seconds"] or -1,
        out["requests"],
        out["failed"],
    )
    return out
