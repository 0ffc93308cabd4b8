"""The release steps: **the** table of what runs, in which order, needing what, undone how.

Everything that knows the step order derives it from :data:`STEPS` — ``run_release`` below, the
CLI's subcommands and help, the Airflow task ids (``seqcls.airflow``), the tasks-test script and
README's step list (a test asserts the DAG's chain equals this table). Each step is a function
``(Release) -> StepResult`` in the module named after it, imported only when it runs so that
importing this table stays cheap (DAG parsing imports it).

``requires`` names the steps whose *successful records* a step reads from the workspace; a step
asks for them through :func:`require` instead of naming them inline, so the dependency graph is
data. ``undo_on_failure`` marks the steps whose failure must be rolled back before the error
propagates (a failed release leaves the served model and the registry as they were). Not
promote: the smoke-tested version keeps serving and a re-run promotes it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqcls import faults
from seqcls.errors import SeqclsError
from seqcls.serving.control import current_context, release_owner
from seqcls.serving.lease import ReleaseLease
from seqcls.workspace import Release, StepResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """One release step: its name (CLI subcommand, manifest key), code, inputs and task id."""

    name: str
    function: str
    task_id: str
    help: str
    requires: tuple[str, ...] = ()
    undo_on_failure: bool = False
    heavy: bool = False  # runs Paddle: may go to another interpreter (SEQCLS_PADDLE_PYTHON)
    module: str = ""

    @property
    def module_name(self) -> str:
        return f"seqcls.steps.{self.module or self.name}"

    def load(self) -> Callable[..., StepResult]:
        return getattr(importlib.import_module(self.module_name), self.function)

    def __call__(self, release: Release, **kwargs: Any) -> StepResult:
        return self.load()(release, **kwargs)


STEPS: tuple[Step, ...] = (
    Step("export", "export", "export_static", "dygraph checkpoint → static graph", heavy=True),
    Step("convert", "convert", "convert_onnx", "static graph → ONNX (verified)", ("export",), heavy=True),
    Step(
        "validate",
        "validate",
        "validate_parity",
        "parity gate: tokenizer ids, logits, decisions",
        ("export", "convert"),
        heavy=True,
    ),
    Step(
        "register",
        "register",
        "register_model",
        "MLflow model version with lineage, alias candidate (idempotent per fingerprint)",
        ("convert", "validate"),
    ),
    Step(
        "publish",
        "publish",
        "publish_repository",
        "write the release as a new immutable Triton version",
        ("validate",),
        undo_on_failure=True,
    ),
    Step(
        "reload",
        "reload",
        "reload_triton",
        "load the published version beside the served one, as the candidate (public ensemble unchanged)",
        ("publish",),
        undo_on_failure=True,
    ),
    Step(
        "smoke",
        "smoke",
        "smoke_test",
        "golden texts over gRPC through the candidate route must give the validated answers",
        ("validate", "publish", "reload"),
        undo_on_failure=True,
    ),
    Step(
        "expose",
        "expose",
        "expose_version",
        "the smoke-tested candidate becomes what the public ensemble serves, on every endpoint",
        ("publish", "smoke"),
        undo_on_failure=True,
    ),
    Step(
        "promote",
        "promote",
        "promote",
        "MLflow alias champion → this version, once it is served (previous kept as previous-champion)",
        ("register", "publish", "smoke"),
    ),
)
#: Steps run on request, outside the release order (the DAG runs rollback only after a failure).
EXTRA_STEPS: tuple[Step, ...] = (
    Step(
        "rollback",
        "rollback",
        "rollback",
        "withdraw this release if in flight, or serve the recorded previous version if it is served",
    ),
)
BY_NAME: dict[str, Step] = {s.name: s for s in (*STEPS, *EXTRA_STEPS)}
ORDER: tuple[str, ...] = tuple(s.name for s in STEPS)
UNDO_ON_FAILURE: tuple[str, ...] = tuple(s.name for s in STEPS if s.undo_on_failure)


def step(name: str) -> Step:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown step {name!r}; steps: {', '.join(BY_NAME)}") from None


def require(release: Release, name: str) -> dict[str, dict[str, Any]]:
    """The manifest records of every step ``name`` requires (StepOrderError naming the first missing)."""
    return {req: release.workspace.require(req) for req in step(name).requires}


def run_release(release: Release, *, until: str | None = None) -> list[StepResult]:
    """Run every step in order (skipping those already done); stop after ``until`` if given.

    The serving steps run under the model's release lease, held (and renewed) by this process from
    the first of them to the end. If a step marked ``undo_on_failure`` fails, this attempt is
    undone (its candidate withdrawn, its registry changes reverted) and the error re-raised.
    """
    if until is not None:
        step(until)
    results = []
    with contextlib.ExitStack() as lease:  # entered at publish, held (with a heartbeat) to the end
        for s in STEPS:
            faults.point(f"step:before:{s.name}")
            if s.name == "publish":
                lease.enter_context(_release_lease(release))
            try:
                result = s(release)
            except SeqclsError as exc:
                if s.undo_on_failure:
                    log.error("%s failed — rolling back this attempt: %s", s.name, exc)
                    rb = BY_NAME["rollback"](release, reason=f"{s.name} failed: {str(exc)[:300]}", mode="attempt")
                    log.info("%s", rb.line())
                raise
            faults.point(f"step:after:{s.name}")
            log.info("%s", result.line())
            results.append(result)
            if s.name == until:
                break
    return results


def _release_lease(release: Release):
    """This process holds the model's release lease as the release's owner (kind ``process``)."""
    lease = ReleaseLease(Path(str(release.settings.triton_repository)), release.config.model_name)
    owner = release_owner(release)
    return lease.hold(owner, kind="process", step="release", timeout=_lease_timeout())


def _lease_timeout() -> float:
    return current_context().timeout
