"""Whether a process on this host is still the one a record names: the dead-holder check of both leases.

Why its own module: the POSIX lease (:mod:`seqcls.serving.lease`) and the store's
(:mod:`seqcls.serving.s3lease`) both recover a holder killed on this host at once instead of after its ttl,
and the POSIX one builds on the store's.
"""

from __future__ import annotations

import os


def pid_start(pid: int) -> float | None:
    """When ``pid`` started (None when unknown): kept beside a pid, so a reused pid is not taken for it."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # psutil missing or process gone: no pid-reuse guard
        return None


def pid_alive(pid: int, started: float | None = None) -> bool:
    """Whether ``pid`` on this host is (still) that process: ``started`` guards against pid reuse."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # cannot tell: treat as alive, the ttl still applies


__all__ = ["pid_alive", "pid_start"]
