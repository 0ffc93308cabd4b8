"""The release steps in order, and ``release`` = run them all (what ``seqcls release`` does).

Each step is a function ``(Release) -> StepResult`` in its own module; this table is the one
place that knows their order, used by the CLI and mirrored by the Airflow DAG's task chain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

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


STEPS: dict[str, Callable[[Release], StepResult]] = {
    "export": _export,
    "convert": _convert,
    "validate": _validate,
}


def run_release(release: Release, *, until: str | None = None) -> list[StepResult]:
    """Run every step in order (skipping those already done); stop after ``until`` if given."""
    results = []
    for name, fn in STEPS.items():
        result = fn(release)
        log.info("%s", result.line())
        results.append(result)
        if name == until:
            break
    return results
