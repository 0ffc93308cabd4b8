"""A documented, test-only fault-injection seam: make a release die or fail at a named point.

Release code calls :func:`point` at places where a crash or a failing write matters, for
example ``step:before:publish``, ``publish:model-written:tokenizer``, ``reload:after-composing``.
Failure drills set ``SEQCLS_FAULT_PLAN`` to a comma-separated list of ``action@point``:

- ``die@<point>``    the process kills itself with SIGKILL (like ``kill -9``: no cleanup runs);
- ``enospc@<point>`` raise ``OSError(ENOSPC)`` as a full disk would;
- ``fail@<point>``   raise ``RuntimeError``;
- ``stall@<point>``  sleep (10 minutes) as a hung load would, so a drill can kill the process — or the
  machine it runs on — exactly there;
- ``pause@<point>``  stop the process (SIGSTOP) until a drill sends SIGCONT: the world can change under a
  release exactly there (a database restarted, a server stopped), then it carries on.

The plan may live in a file (``SEQCLS_FAULT_PLAN=@/path``, read at every point, missing = no plan), so
a drill can change it while long-running workers keep their environment.

Unset (production), :func:`point` costs one environment lookup. Point names are validated
(``^[a-z]+(:[a-z0-9_.-]+)+$``) so a typo in the code fails every test, not silently no drill.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
import signal
import sys
import time

from seqcls.settings import ENV_FAULT_PLAN, fault_plan

log = logging.getLogger(__name__)

ACTIONS = ("die", "enospc", "fail", "stall", "pause")
STALL_SECONDS = 600.0
_POINT_RE = re.compile(r"^[a-z]+(:[a-z0-9_.-]+)+$")


@functools.lru_cache(maxsize=1024)
def _check(name: str) -> str:
    if not isinstance(name, str) or not _POINT_RE.match(name):
        raise ValueError(f"fault point {name!r} is not a valid name (expected e.g. 'reload:after-composing')")
    return name


@functools.lru_cache(maxsize=16)
def parse_plan(plan: str) -> dict[str, str]:
    """``"die@a:b,enospc@c:d"`` → ``{"a:b": "die", "c:d": "enospc"}``; a malformed plan is a ValueError."""
    out: dict[str, str] = {}
    for item in (p.strip() for p in plan.split(",")):
        if not item:
            continue
        action, sep, name = item.partition("@")
        if not sep or action not in ACTIONS:
            raise ValueError(f"{ENV_FAULT_PLAN}: {item!r} is not '<{'|'.join(ACTIONS)}>@<point>'")
        out[_check(name)] = action
    return out


def _flush_logs() -> None:
    for logger in (logging.getLogger(), *logging.Logger.manager.loggerDict.values()):
        for handler in getattr(logger, "handlers", ()):
            with contextlib.suppress(Exception):
                handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def point(name: str) -> None:
    """A named point in the release code; does what ``SEQCLS_FAULT_PLAN`` says for it, else nothing."""
    _check(name)
    plan = fault_plan()
    if not plan:
        return
    action = parse_plan(plan).get(name)
    if action is None:
        return
    where = f"injected by {ENV_FAULT_PLAN} at {name}"
    if action == "die":
        log.critical("fault: killing process %d with SIGKILL (%s)", os.getpid(), where)
        _flush_logs()
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stall":
        log.critical("fault: process %d stalls for %.0fs (%s)", os.getpid(), STALL_SECONDS, where)
        _flush_logs()
        time.sleep(STALL_SECONDS)
    elif action == "pause":
        log.critical("fault: process %d pauses until SIGCONT (%s)", os.getpid(), where)
        _flush_logs()
        os.kill(os.getpid(), signal.SIGSTOP)
        log.warning("fault: process %d continues after %s", os.getpid(), name)
    elif action == "enospc":
        log.error("fault: raising ENOSPC (%s)", where)
        raise OSError(errno.ENOSPC, f"No space left on device ({where})")
    else:
        log.error("fault: raising RuntimeError (%s)", where)
        raise RuntimeError(f"injected failure ({where})")


__all__ = ["ACTIONS", "parse_plan", "point"]
