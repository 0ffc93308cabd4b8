"""The release steps: **the** table of what runs, in which order, needing what, undone how.

Everything that knows the step order derives it from :data:`STEPS` — ``run_release`` below, the
CLI's subcommands and help, the Airflow task ids (``seqcls.airflow``), the tasks-test script and
the manual's step list (tests assert the DAG's chain and docs/architecture.md equal this table). Each step is a function
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
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqcls import faults
from seqcls.errors import SeqclsError, StepOrderError
from seqcls.frameworks.output import library_output
from seqcls.registry import journal
from seqcls.registry.ledger import undo
from seqcls.release import verdicts
from seqcls.release.control import current_context, release_owner
from seqcls.release.workspace import Release, StepResult
from seqcls.serving.lease import ReleaseLease
from seqcls.serving.state import append_event, current_state, state_path
from seqcls.serving.statelog import log_path

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
        with library_output(self.name):  # the libraries' banners and warnings at debug: the log tells the step
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
        "evaluate",
        "evaluate",
        "evaluate_quality",
        "quality gate: the serving graph vs the served champion on a labeled eval set",
        ("convert", "validate"),
    ),
    Step(
        "register",
        "register",
        "register_model",
        "MLflow model version with lineage, alias candidate (idempotent per fingerprint)",
        ("convert", "validate", "evaluate"),
        undo_on_failure=True,
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


#: The steps that judge (each gate's step, in order), and the steps that bring a release nearer to live:
#: before these run, whatever runs them, the gates are asked again (:func:`ask_the_gates`).
GATE_STEPS = tuple(verdicts.GATES.values())
NEARER_TO_LIVE = ("publish", "reload", "smoke", "expose")


def require(release: Release, name: str) -> dict[str, dict[str, Any]]:
    """The manifest records of every step ``name`` requires (StepOrderError naming the first missing); for a
    step nearer to live, also the gates' verdicts, asked again; for promote, the verdicts it went live with."""
    records = {req: release.workspace.require(req) for req in step(name).requires}
    if name in NEARER_TO_LIVE:
        ask_the_gates(release, name)
    elif name == "promote":
        held = verdicts.verdicts(release.workspace)
        broken = [f"{g} {v.state}" for g, v in held.items() if not v.holds]
        if broken:
            raise StepOrderError(
                f"promote: this release's verdicts do not hold ({', '.join(broken)}); nothing becomes champion "
                "without passed or overridden verdicts — run `seqcls release` for it"
            )
    return records


def ask_the_gates(release: Release, name: str) -> None:
    """Each gate step again, through the table: done for these very inputs it answers from its record (a skip);
    bound to something that changed since — the champion, the rules, the eval set, the graph, an override — it
    judges again; refused, it refuses again. So ``seqcls publish`` (or ``reload``, ``smoke``, ``expose``, or an
    Airflow task) of a checkpoint the gates refused is refused, and a stale verdict is re-judged, not trusted."""
    for gate_step in GATE_STEPS:
        if not release.workspace.step(gate_step):
            raise StepOrderError(
                f"step {gate_step!r} has not run for workspace {release.workspace.root}: {name} needs its verdict; "
                f"run `seqcls {gate_step}` (or `seqcls release`) first."
            )
        log.info("%s: asking the %s gate again (its verdict must hold for what goes live)", name, gate_step)
        BY_NAME[gate_step](release)


def record_refusal(release: Release, gate: str, exc: BaseException) -> None:
    """Append a gate's refusal to the model's serving log (``seqcls history``), once the model has one.
    Never raises: the refusal is the step's outcome, and must not become another error because the
    log is unwritable."""
    try:
        root, model = Path(str(release.settings.triton_repository)), release.config.model_name
        if not log_path(root, model).exists() and not state_path(root, model).exists():
            # a model never released: a refusal leaves the repository exactly as it was (no file that
            # would make status and sync list a model that serves nothing); MLflow and the workspace keep it
            log.info(
                "%s refusal of %s not in the serving log: nothing of %s was ever released to %s "
                "(SEQCLS_TRITON_REPOSITORY)",
                gate,
                model,
                model,
                root,
            )
            return
        try:
            serving = current_state(root, model).serving
        except Exception:  # a damaged state: the refusal is still worth recording
            serving = None
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:2000]
        append_event(
            root,
            model,
            "refused",
            gate=gate,
            fingerprint=release.checkpoint.fingerprint,
            serving=serving,
            reason=reason,
            workspace=str(release.workspace.root),
        )
    except Exception as log_exc:
        log.warning("%s refusal not recorded in the serving log: %s", gate, log_exc)


class Terminated(SeqclsError):
    """SIGTERM (Airflow's task timeout, an operator's ``kill``) ended a release: this attempt was undone."""


#: The step from which a release holds the model's lease (and from which its failure is undone).
LEASE_FROM = "register"


def run_release(release: Release, *, until: str | None = None) -> list[StepResult]:
    """Run every step in order (skipping those already done); stop after ``until`` if given.

    From ``register`` on, this process holds the model's release lease (renewed by a heartbeat)
    to the end. Any failure there — taking the lease too, or SIGTERM (a graceful abort in the
    main thread) — undoes this attempt (its candidate withdrawn, its journalled registry changes
    reverted, never champion) before the error propagates; the lease is then released. The
    attempt's registry changes are kept once it completed (exposed, or returned normally).
    """
    if until is not None:
        step(until)
    results: list[StepResult] = []
    cfg = release.config
    attempt = journal.Attempt.new(
        cfg.model_name,
        release_owner(release),
        workspace=str(release.workspace.root),
        fingerprint=release.checkpoint.fingerprint,
    )
    with sigterm_aborts(release) as sigterm, journal.attempt_scope(attempt), contextlib.ExitStack() as lease:
        current: Step | None = None
        try:
            for s in STEPS:
                sigterm.rearm()
                faults.point(f"step:before:{s.name}")
                current = s
                if s.name == LEASE_FROM:
                    lease.enter_context(_release_lease(release))
                result = s(release)
                if s.name == "expose":  # served: this attempt's registry changes stay, nothing is undone now
                    journal.end(release.settings, cfg.model_name, attempt.id, "completed")
                    current = None
                sigterm.check()
                faults.point(f"step:after:{s.name}")
                log.info("%s", result.line())
                results.append(result)
                if s.name == until:
                    break
        except BaseException as exc:
            if current is not None and current.undo_on_failure:
                undo_attempt(release, attempt, current.name, exc)
            raise
    journal.end(release.settings, cfg.model_name, attempt.id, "completed")
    return results


def undo_attempt(release: Release, attempt: journal.Attempt, failed: str, exc: BaseException) -> None:
    """Undo this attempt after step ``failed`` raised ``exc``: Triton (from publish on) and the registry.

    A failure in register (or in taking the lease) reached only the registry, and only through the
    journal: the workspace's register record may be an earlier attempt's, which is not ours to undo.
    The rollback step failing too (an unreadable state, Triton down) still reverts the registry.
    """
    reason = f"{failed} failed: {str(exc)[:300] or type(exc).__name__}"
    log.error("%s failed — rolling back this attempt: %s", failed, str(exc) or type(exc).__name__)
    if failed != LEASE_FROM:
        try:
            log.info("%s", BY_NAME["rollback"](release, reason=reason, mode="attempt").line())
        except Exception as rb_exc:
            log.error("rollback of this attempt failed (%s); reverting its registry changes alone", rb_exc)
            with contextlib.suppress(Exception):
                undo(release, reason=reason, champion=False)
    try:
        done = journal.undo_attempt(release.settings, release.config.model_name, attempt.id, reason=reason)
        if done["actions"]:
            log.info("registry journal: %s", "; ".join(done["actions"]))
    except Exception as j_exc:  # MLflow down: the next release or `seqcls sync` undoes it (journal kept)
        log.error("registry changes of this attempt not undone (%s); the next release or `seqcls sync` will", j_exc)


@dataclass
class Sigterm:
    """What :func:`sigterm_aborts` yields: the exception once SIGTERM came, and :meth:`rearm`."""

    fired: list[Terminated]
    handler: Callable[..., None] | None = None

    def rearm(self) -> None:
        """Install the handler again: importing Paddle replaces SIGTERM's C handler with its own (which dies)."""
        if self.handler is not None:
            signal.signal(signal.SIGTERM, self.handler)

    def check(self) -> None:
        """Re-raise the signal's exception should the code it interrupted have swallowed it (a broad retry loop)."""
        if self.fired:
            raise self.fired[0]


@contextlib.contextmanager
def sigterm_aborts(release: Release) -> Iterator[Sigterm]:
    """SIGTERM raises :class:`Terminated` in the main thread (once: the undo it triggers is not interrupted);
    a previous Python handler (Airflow's task runner calls the operator's ``on_kill``) runs first."""
    term = Sigterm([])
    if threading.current_thread() is not threading.main_thread():
        yield term
        return

    def handler(signum: int, frame: Any) -> None:
        if term.fired:
            log.warning("SIGTERM again: still undoing this attempt (SIGKILL would leave it to the next release)")
            return
        term.fired.append(
            Terminated(
                f"release of {release.config.model_name} ({release.checkpoint.origin}) terminated by SIGTERM; "
                "this attempt is undone (what is served and the registry as before it)."
            )
        )
        if callable(previous):
            previous(signum, frame)
        raise term.fired[0]

    term.handler = handler
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield term
    finally:
        signal.signal(signal.SIGTERM, previous)


def _release_lease(release: Release):
    """This process holds the model's release lease as the release's owner (kind ``process``)."""
    lease = ReleaseLease(Path(str(release.settings.triton_repository)), release.config.model_name)
    owner = release_owner(release)
    return lease.hold(owner, kind="process", step="release", timeout=_lease_timeout())


def _lease_timeout() -> float:
    return current_context().timeout
