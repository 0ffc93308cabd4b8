"""The release steps in order, and ``release`` = run them all (what ``seqcls release`` does).

Each step is a function ``(Release) -> StepResult`` in its own module; this table is the one
place that knows their order, used by the CLI and mirrored by the Airflow DAG's task chain.
A failure of ``publish``, ``reload`` or ``smoke`` triggers a rollback before the error propagates, so a failed
release leaves the served model as it was.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from seqcls.errors import SeqclsError
from seqcls.workspace import Release, StepResult

log = logging.getLogger(__name__)


def _lazy(module: str, name: str, **kwargs: Any) -> Callable[[Release], StepResult]:
    """A step function imported on first call, so importing the pipeline stays cheap."""

    def run(release: Release) -> StepResult:
        return getattr(importlib.import_module(module), name)(release, **kwargs)

    run.__name__ = name
    return run


STEPS: dict[str, Callable[[Release], StepResult]] = {
    "export": _lazy("seqcls.export", "export"),
    "convert": _lazy("seqcls.convert", "convert"),
    "validate": _lazy("seqcls.validate", "validate"),
    "register": _lazy("seqcls.registry", "register"),
    "publish": _lazy("seqcls.publish", "publish"),
    "reload": _lazy("seqcls.reload", "reload"),
    "smoke": _lazy("seqcls.smoke", "smoke"),
    "promote": _lazy("seqcls.registry", "promote"),
}
#: Steps whose failure must be undone (registry changes from register, live servers from reload).
#: Not promote: the smoke-tested version keeps serving and a re-run promotes it (as in the DAG).
GUARDED = ("publish", "reload", "smoke")
EXTRA_STEPS: dict[str, Callable[[Release], StepResult]] = {
    "rollback": _lazy("seqcls.rollback", "rollback", reason="requested")
}


def run_release(release: Release, *, until: str | None = None) -> list[StepResult]:
    """Run every step in order (skipping those already done); stop after ``until`` if given.

    If publish, reload or smoke fails, roll back (what was served, the registry) and re-raise.
    """
    results = []
    for name, fn in STEPS.items():
        try:
            result = fn(release)
        except SeqclsError as exc:
            if name in GUARDED:
                from seqcls.rollback import rollback

                log.error("%s failed — rolling back: %s", name, exc)
                rb = rollback(release, reason=f"{name} failed: {str(exc)[:300]}")
                log.info("%s", rb.line())
            raise
        log.info("%s", result.line())
        results.append(result)
        if name == until:
            break
    return results
