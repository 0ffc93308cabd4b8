"""The server's processes: its own session and process group, signals, waits, shared memory.

The server runs with ``start_new_session=True``: it survives the CLI or Airflow task that
started it, and every python backend stub it spawns shares its process group, so one
``killpg`` reaches them all. We never signal a group the server does not lead (it could be the
caller's). Stubs outlive a SIGKILLed server, keeping its pgid, and its python-backend shared
memory regions stay in ``/dev/shm``: the server is started with a per-run region prefix
(``seqcls-<8 hex>-``) so exactly those regions, and nothing else, can be removed afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

from seqcls.errors import ServingError

log = logging.getLogger(__name__)

_SHM_DIR = Path("/dev/shm")
_SHM_PREFIX_RE = re.compile(r"^seqcls-[0-9a-f]{8}-$")

Process = subprocess.Popen[bytes] | psutil.Process


def process_alive(process: Process) -> bool:
    if isinstance(process, subprocess.Popen):
        return process.poll() is None
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def exit_code(process: Process) -> str:
    if isinstance(process, subprocess.Popen):
        return str(process.returncode)
    return "unknown (not our child)"


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until ``procs`` exit; returns those still alive. A zombie counts as gone: orphans are
    reaped by init whenever it gets to it, which can take seconds in some containers."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if process_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if process_alive(p)]
    return alive


def _wait(procs: list[psutil.Process], timeout: float, child: subprocess.Popen[bytes] | None) -> list[psutil.Process]:
    """Wait for ``procs`` to exit; reaps our own Popen ``child`` through Popen so it keeps its code."""
    deadline = time.monotonic() + max(timeout, 0.0)
    if child is not None:
        for p in procs:
            if p.pid == child.pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=max(deadline - time.monotonic(), 0.0))
    return wait_gone(procs, max(deadline - time.monotonic(), 0.0))


def _pgid(pid: int) -> int | None:
    """The server's own process group (it is a session leader); None if that is not the case."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return None
    return pgid if pgid == pid else None  # never signal a group we do not own (e.g. the caller's)


def group_members(pgid: int | None) -> list[psutil.Process]:
    if pgid is None:
        return []
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getpgid(p.pid) == pgid:
                members.append(p)
    return members


def _signal(pid: int, pgid: int | None, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pgid is not None:
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)


def terminate(pid: int, shm_prefix: str | None, timeout: float, child: subprocess.Popen[bytes] | None) -> None:
    """Stop the whole process group: the server and every python backend stub it spawned.

    SIGTERM first, SIGKILL for what outlives ``timeout``; then its shared memory is removed.
    ``child`` is the server's Popen when this process started it (so its exit code is kept).
    """
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        members = []
    pgid = _pgid(pid)
    members += [p for p in group_members(pgid) if p not in members]
    _signal(pid, pgid, signal.SIGTERM)
    alive = _wait(members, timeout, child)
    if alive:
        log.warning(
            "tritonserver pid %d did not exit within %.0f s; sending SIGKILL to %d process(es)",
            pid,
            timeout,
            len(alive),
        )
        _signal(pid, pgid, signal.SIGKILL)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        alive = _wait(alive, 5.0, child)
    # Anything still in the group (a stub spawned mid-shutdown) goes too.
    leftovers = [p for p in group_members(pgid) if p.is_running()]
    for p in leftovers:
        with contextlib.suppress(psutil.Error):
            p.kill()
    alive = _wait(alive + leftovers, 5.0, child)
    if alive:
        raise ServingError(f"could not stop tritonserver processes {[p.pid for p in alive]}")
    remove_shm(shm_prefix)


def kill_orphaned_stubs(pid: int) -> None:
    """Kill the python backend stubs a dead server left behind (they keep its pgid)."""
    killed: list[psutil.Process] = []
    for p in group_members(pid):
        with contextlib.suppress(psutil.Error):
            if "triton_python_backend_stub" in " ".join(p.cmdline()):
                log.warning("killing orphaned python backend stub pid %d", p.pid)
                p.kill()
                killed.append(p)
    wait_gone(killed, timeout=5.0)


def remove_shm(prefix: str | None) -> None:
    """Remove python-backend regions a killed server left behind (only our own prefix)."""
    if not prefix or not _SHM_PREFIX_RE.match(prefix) or not _SHM_DIR.is_dir():
        return
    for path in _SHM_DIR.glob(prefix + "*"):
        with contextlib.suppress(OSError):
            path.unlink()
            log.debug("removed leftover shared memory %s", path)


def warn_low_shm() -> None:
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(_SHM_DIR).free
        if free < 64 * 1024 * 1024:
            log.warning(
                "only %d MiB free in /dev/shm; the python backend needs shared memory per model "
                "instance (docker: --shm-size=1g)",
                free // (1024 * 1024),
            )
