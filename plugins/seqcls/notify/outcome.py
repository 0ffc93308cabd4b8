"""A release's outcome as people are told it: which model, what happened, why, in the one version vocabulary.

Built from what a release already records — the workspace's step records (:mod:`seqcls.release.workspace`), the
recorded serving state and its log (:mod:`seqcls.serving.state`, :mod:`seqcls.ops.history`) — by the two
callers that know where a release stopped: the CLI (:mod:`seqcls.notify.commands`, from the exception or
exit code) and the Airflow report task (:mod:`seqcls.airflow.outcome`, from the run's task states).
:func:`classify` is their shared rule for *refused* (the input, a gate or a person said no) versus
*failed* (something broke). Nothing here sends anything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seqcls.contract.names import ModelName
from seqcls.ops.history import read_entries, version_label
from seqcls.registry.ledger import model_version_url
from seqcls.release.workspace import MANIFEST, workspace_dir
from seqcls.serving.state import current_state
from seqcls.settings import Settings
from seqcls.steps import ORDER

log = logging.getLogger(__name__)

PROMOTED = "promoted"  # served and MLflow champion
REFUSED = "refused"  # at preflight, by a gate (parity, quality) or by the approver: nothing changed
FAILED = "failed"  # something broke; when it got far enough, this attempt was undone (rollback)
ROLLED_BACK = "rolled-back"  # an operator's `seqcls rollback`
SKIPPED = "skipped"  # the checkpoint already is the champion: nothing to release
KINDS = (PROMOTED, REFUSED, FAILED, ROLLED_BACK, SKIPPED)

#: Pseudo-steps around the step table: resolve (params, checkpoint, servers) and the human approval.
RESOLVE = "resolve"
APPROVAL = "approval"
PREFLIGHT = "preflight"
#: The gate each gate step is (a GateError there is a refusal, not a failure).
GATES = {"validate": "parity", "evaluate": "quality"}
#: Exception types that mean "the input is wrong": a refusal wherever they stop the release.
INPUT_ERRORS = frozenset({"InputError", "CheckpointError", "PreflightError"})
#: What a rollback did after a failure: nothing ran, this attempt was undone, or the undo failed too.
UNDONE, UNDO_FAILED = "undone", "failed"


@dataclass
class Outcome:
    """One release outcome (or operator rollback), everything a notification says; JSON-serialisable."""

    model: str
    kind: str
    reason: str = ""
    step: str | None = None  # where the release stopped: a step (CLI) or task id (Airflow)
    gate: str | None = None  # refused by: preflight | parity | quality | approval
    rollback: str = ""  # after a failure: "" (nothing to undo) | "undone" | "failed"
    triton_version: int | None = None  # the release's version (promoted / withdrawn) or the one rolled back to
    mlflow_version: int | None = None
    serving: int | None = None  # what the public ensemble serves now
    serving_mlflow: int | None = None
    previous: int | None = None  # rolled back (or promoted) from
    previous_mlflow: int | None = None
    fingerprint: str | None = None  # first 12 hex digits
    checkpoint: str | None = None
    gates: dict[str, str] = field(default_factory=dict)  # parity / quality → passed | refused | failed | OVERRIDDEN…
    links: dict[str, str] = field(default_factory=dict)  # label → URL (Airflow run, MLflow version)
    user: str = ""
    host: str = ""
    via: str = ""  # "seqcls release" | "Airflow seqcls_release run manual__…"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"outcome kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.fingerprint:
            self.fingerprint = self.fingerprint[:12]

    def release_label(self) -> str:
        """``Triton v5 (MLflow v4)``; the MLflow number only when known."""
        return version_label(self.triton_version, self.mlflow_version, registry=False)

    def serving_label(self) -> str:
        return version_label(self.serving, self.serving_mlflow, registry=False)

    def previous_label(self) -> str:
        return version_label(self.previous, self.previous_mlflow, registry=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def classify(step: str | None, error_type: str = "", *, promoted: bool = False) -> tuple[str, str | None]:
    """``(kind, gate)`` of a release that stopped at ``step`` (None: it did not stop) with ``error_type``.

    Refused: anything at resolve (preflight), a GateError at a gate, a person's rejection, bad input at
    any step. Failed: everything else. Not stopped: promoted, or skipped when it never got to promote.
    """
    if step is None:
        return (PROMOTED if promoted else SKIPPED), None
    if step == RESOLVE:
        return REFUSED, PREFLIGHT
    if step == APPROVAL:
        return REFUSED, APPROVAL
    if step in GATES and error_type == "GateError":
        return REFUSED, GATES[step]
    if error_type in INPUT_ERRORS:
        return REFUSED, None
    return FAILED, None


def error_type(error: str) -> str:
    """``"GateError"`` from a recorded ``"GateError: message"`` ('' when it names no type)."""
    head, sep, _ = error.partition(":")
    return head.strip() if sep and head.strip().isidentifier() else ""


def error_reason(error: str, limit: int = 600) -> str:
    """The message of a recorded ``"Type: message"``, without the type of a seqcls error (its message says
    what to do), cut at a word boundary."""
    kind = error_type(error)
    text = error.partition(":")[2].strip() if kind.endswith(("Error", "Exception")) else error.strip()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


@dataclass
class ReleaseFacts:
    """What a release workspace records about one release (versions, gates, the failed step, links)."""

    fingerprint: str | None = None
    checkpoint: str | None = None
    triton_version: int | None = None
    mlflow_version: int | None = None
    previous_mlflow: int | None = None
    gates: dict[str, str] = field(default_factory=dict)
    failed_step: str | None = None
    error: str = ""
    undone: bool = False  # the rollback step withdrew this attempt's candidate
    mlflow_url: str | None = None


def read_manifest(root: Path) -> dict[str, Any] | None:
    """A workspace's manifest (None if it has none or it is unreadable: a notification then says less)."""
    try:
        return json.loads((Path(root) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.debug("no readable manifest in %s: %s", root, exc)
        return None


def _since(record: dict[str, Any], since: str | None) -> bool:
    return since is None or str(record.get("finished_at") or "") >= since


def release_facts(
    manifest: dict[str, Any], *, reached: Collection[str] | None = None, since: str | None = None
) -> ReleaseFacts:
    """The facts of one attempt: ``reached`` = the steps it ran (None: every recorded one); ``since`` = when
    it started (ISO, UTC): a failed or rollback record older than that is an earlier attempt's."""
    steps: dict[str, dict[str, Any]] = manifest.get("steps") or {}
    ckpt = manifest.get("checkpoint") or {}
    facts = ReleaseFacts(fingerprint=manifest.get("fingerprint"), checkpoint=ckpt.get("source") or ckpt.get("path"))

    def ran(name: str) -> dict[str, Any] | None:
        rec = steps.get(name)
        return rec if rec and (reached is None or name in reached) else None

    for name in ORDER:
        rec = ran(name)
        if rec and rec.get("status") == "failed" and _since(rec, since) and facts.failed_step is None:
            facts.failed_step, facts.error = name, str(rec.get("error") or "")
    for name, gate in GATES.items():
        rec = ran(name)
        override = ((rec or {}).get("summary") or {}).get("override")
        if rec and rec.get("status") == "ok" and override:  # loud in the notification too: who, why
            facts.gates[gate] = f"OVERRIDDEN by {override.get('by', '?')}: {override.get('reason', '')}"
        elif rec and rec.get("status") == "ok":
            facts.gates[gate] = "passed"
        elif rec and rec.get("status") == "failed" and _since(rec, since):
            facts.gates[gate] = "refused" if error_type(str(rec.get("error"))) == "GateError" else "failed"
    published, registered, promoted = (ran(n) or {} for n in ("publish", "register", "promote"))
    facts.triton_version = (published.get("summary") or {}).get("version") if published.get("status") == "ok" else None
    if registered.get("status") == "ok":
        facts.mlflow_version = (registered.get("summary") or {}).get("version")
    if promoted.get("status") == "ok":
        summary = promoted.get("summary") or {}
        facts.mlflow_version = summary.get("version", facts.mlflow_version)
        facts.triton_version = summary.get("triton_version", facts.triton_version)
        facts.previous_mlflow, facts.mlflow_url = summary.get("previous"), summary.get("url")
    rolled = steps.get("rollback")
    if rolled and rolled.get("status") == "ok" and _since(rolled, since):
        facts.undone = bool((rolled.get("summary") or {}).get("rolled_back"))
    return facts


def workspace_facts(
    settings: Settings, model: ModelName, fingerprint: str | None, **kwargs: Any
) -> ReleaseFacts | None:
    """:func:`release_facts` of ``model``'s workspace for ``fingerprint`` (None without one)."""
    if not fingerprint:
        return None
    manifest = read_manifest(workspace_dir(settings, model, fingerprint))
    return release_facts(manifest, **kwargs) if manifest else None


def serving_now(settings: Settings, model: str) -> tuple[int | None, int | None, dict[int, int]]:
    """(Triton version ``model`` serves per its recorded state, the one it served before, Triton → MLflow
    numbers from the champion moves its log recorded); nothing when unreadable (a warning, never an error)."""
    root = Path(str(settings.triton_repository))
    try:
        state = current_state(root, model)
        return state.serving, state.previous, mlflow_numbers(root, model)
    except Exception as exc:
        log.warning("notification: the serving state of %s is unreadable (%s)", model, exc)
        return None, None, {}


def mlflow_numbers(repository: Path, model: str) -> dict[int, int]:
    """Triton version → MLflow version, from the champion moves ``model``'s serving log recorded."""
    entries, _ = read_entries(repository, model)
    return {e.to_version: e.to_mlflow for e in entries if e.kind == "promote" and e.to_version and e.to_mlflow}


def fill(outcome: Outcome, facts: ReleaseFacts | None, settings: Settings | None = None) -> Outcome:
    """``outcome`` with the workspace's facts and what is served now: the checkpoint as the release took it
    in, the rest only where the caller did not already know it."""
    if facts is not None:
        outcome.fingerprint = outcome.fingerprint or (facts.fingerprint or "")[:12] or None
        outcome.checkpoint = facts.checkpoint or outcome.checkpoint  # as the release took it in
        outcome.triton_version = outcome.triton_version or facts.triton_version
        outcome.mlflow_version = outcome.mlflow_version or facts.mlflow_version
        outcome.previous_mlflow = outcome.previous_mlflow or facts.previous_mlflow
        outcome.gates = {**facts.gates, **outcome.gates}
        if facts.mlflow_url:
            outcome.links.setdefault("MLflow", facts.mlflow_url)
    if settings is not None:
        serving, previous, numbers = serving_now(settings, outcome.model)
        if outcome.serving is None:
            outcome.serving, outcome.serving_mlflow = serving, numbers.get(serving or 0)
        if outcome.kind == PROMOTED and outcome.previous is None:
            outcome.previous = previous
        outcome.previous_mlflow = outcome.previous_mlflow or numbers.get(outcome.previous or 0)
        if "MLflow" not in outcome.links and outcome.kind == PROMOTED and outcome.mlflow_version:
            url = model_version_url(settings, outcome.model, outcome.mlflow_version)
            if url:
                outcome.links["MLflow"] = url
    return outcome


__all__ = [
    "APPROVAL",
    "FAILED",
    "GATES",
    "KINDS",
    "PREFLIGHT",
    "PROMOTED",
    "REFUSED",
    "RESOLVE",
    "ROLLED_BACK",
    "SKIPPED",
    "UNDONE",
    "UNDO_FAILED",
    "Outcome",
    "ReleaseFacts",
    "classify",
    "error_reason",
    "error_type",
    "fill",
    "mlflow_numbers",
    "read_manifest",
    "release_facts",
    "serving_now",
    "workspace_facts",
]
