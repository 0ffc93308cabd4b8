"""The release steps in order, and ``release`` = run them all (what ``seqcls release`` does).

Each step is a function ``(Release) -> StepResult`` in its own module; this table is the one
place that knows their order, used by the CLI and mirrored by the Airflow DAG's task chain.
A failure from ``publish`` on triggers a rollback before the error propagates, so a failed
release leaves the served model as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from seqcls.errors import SeqclsError
from seqcls.workspace import Release, StepResult

log = logging.getLogger(__name__)


def _export(release: Release) -> StepResult:
    from seqcls.export import export

    return export(release)


def _convert(release: Release) -> StepResult:
    from seqcls.convert import convert

    return convert(release)


def _validate(release: Release) -> StepResult:
    from seqcls.validate import validate

    return validate(release)


def _register(release: Release) -> StepResult:
    from seqcls.registry import register

    return register(release)


def _promote(release: Release) -> StepResult:
    from seqcls.registry import promote

    return promote(release)


def _publish(release: Release) -> StepResult:
    from seqcls.publish import publish

    return publish(release)


def _reload(release: Release) -> StepResult:
    from seqcls.reload import reload

    return reload(release)


def _smoke(release: Release) -> StepResult:
    from seqcls.smoke import smoke

    return smoke(release)


def _rollback(release: Release) -> StepResult:
    from seqcls.rollback import rollback

    return rollback(release, reason="requested")


STEPS: dict[str, Callable[[Release], StepResult]] = {
    "export": _export,
    "convert": _convert,
    "validate": _validate,
    "register": _register,
    "publish": _publish,
    "reload": _reload,
    "smoke": _smoke,
    "promote": _promote,
}
#: Steps whose failure must be undone (registry changes from register, live servers from reload).
GUARDED = ("publish", "reload", "smoke", "promote")
EXTRA_STEPS: dict[str, Callable[[Release], StepResult]] = {"rollback": _rollback}


def run_release(release: Release, *, until: str | None = None) -> list[StepResult]:
    """Run every step in order (skipping those already done); stop after ``until`` if given.

    If a step from ``publish`` on fails, roll back (what was served, the registry) and re-raise.
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
