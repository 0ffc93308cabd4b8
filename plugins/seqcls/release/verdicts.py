"""A release's verdicts: what each gate decided, bound to what it judged — and the overrides given, loudly.

A gate's verdict is its step's record in the workspace: ``validate`` (parity), ``evaluate`` (quality), each
with the inputs it judged (the candidate's graph, the champion and its published key, the eval set's
sha256, the rules) hashed into ``inputs_key``. Whatever runs the release — ``seqcls release``, one CLI step
at a time, an Airflow task — the steps that bring it nearer to live ask the gates again first
(:func:`seqcls.steps.require`): a gate step done for these very inputs answers from its record, one whose
bindings changed judges again, a refused one refuses again. Nothing reaches Triton without them.

An operator may override a gate, never silently: ``--override GATE --reason "…"`` (the ``override`` and
``override_reason`` release params). The gate still judges; its refusal is then recorded as *overridden* —
in the step's record, as a ``WARNING`` in the release's log, as an ``override`` event of the model's serving
log (``seqcls history``), as MLflow tags, in the published version's ``release.json`` (``seqcls status``) and
in the notification. Loosening a rule beyond its default is itself an override
(:meth:`seqcls.config.ReleaseConfig.loosened`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.release.workspace import Release, Workspace
from seqcls.serving.state import append_event
from seqcls.serving.statelog import actor

log = logging.getLogger(__name__)

#: Each gate and the step that judges it.
GATES = {"parity": "validate", "quality": "evaluate"}
#: Verdicts a release may go live with.
HOLDING = ("passed", "skipped", "overridden")
#: Where the published version records them (its ``release.json``).
VERDICTS_KEY = "verdicts"


@dataclass(frozen=True)
class Verdict:
    """One gate's decision as its step recorded it."""

    gate: str
    state: str  # passed | skipped | overridden | refused | not run
    override: dict[str, Any] | None = None
    judged: dict[str, Any] | None = None  # what it was bound to (eval set, champion), as the step summarised it

    @property
    def holds(self) -> bool:
        return self.state in HOLDING

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        if self.override:
            out["override"] = self.override
        if self.judged:
            out["judged"] = self.judged
        return out


def verdict(ws: Workspace, gate: str) -> Verdict:
    """``gate``'s verdict from its step's latest record in ``ws``."""
    rec = ws.step(GATES[gate]) or {}
    status, summary = rec.get("status"), rec.get("summary") or {}
    if status == "failed":
        return Verdict(gate, "refused")
    if status != "ok":
        return Verdict(gate, "not run")
    state = "overridden" if summary.get("overridden") else "skipped" if summary.get("skipped") else "passed"
    judged = {k: summary[k] for k in ("eval_set", "champion_version") if summary.get(k) is not None}
    return Verdict(gate, state, summary.get("override"), judged or None)


def verdicts(ws: Workspace) -> dict[str, Verdict]:
    return {gate: verdict(ws, gate) for gate in GATES}


def published(ws: Workspace) -> dict[str, Any]:
    """What a published version's ``release.json`` records of the verdicts it went out with."""
    return {gate: v.to_dict() for gate, v in verdicts(ws).items()}


def unverified(info: dict[str, Any] | None) -> str | None:
    """Why a published version's ``release.json`` does not show passed-or-overridden verdicts (None: it does)."""
    if not info:
        return None
    recorded = info.get(VERDICTS_KEY)
    if not isinstance(recorded, dict):
        return "it went live without passed or overridden verdicts (its release.json records none)"
    missing = [g for g in GATES if (recorded.get(g) or {}).get("state") not in HOLDING]
    if missing:
        states = ", ".join(f"{g} {(recorded.get(g) or {}).get('state', 'none')}" for g in missing)
        return f"it went live without passed or overridden verdicts ({states})"
    return None


def overrides_of(info: dict[str, Any] | None) -> list[str]:
    """``quality by alice@host: <reason>`` for each gate a published version went live under an override of."""
    recorded = (info or {}).get(VERDICTS_KEY) or {}
    out = []
    for gate in GATES:
        ov = (recorded.get(gate) or {}).get("override")
        if (recorded.get(gate) or {}).get("state") == "overridden" and isinstance(ov, dict):
            out.append(f"{gate} by {ov.get('by', '?')}: {ov.get('reason', '')}")
    return out


def override_for(release: Release, gate: str, refusal: BaseException) -> dict[str, Any] | None:
    """The override of ``gate``'s refusal this release was given (None: none — the refusal stands). Said at
    WARNING in the release's own log: who, why, and the verdict overridden."""
    cfg = release.config
    if gate not in cfg.overrides:
        return None
    who = actor()
    record = {
        "gate": gate,
        "reason": cfg.override_reason,
        "by": f"{who['user']}@{who['host']}",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "verdict": str(refusal)[:4000],
        **{f"airflow_{k}": str(who[k]) for k in ("dag_id", "run_id") if who.get(k)},
    }
    log.warning(
        "OVERRIDE of the %s gate of %s by %s — %s. The gate refused: %s",
        gate,
        cfg.model_name,
        record["by"],
        cfg.override_reason,
        record["verdict"],
    )
    return record


def record_override(release: Release, override: dict[str, Any]) -> None:
    """The override as an event of the model's serving log (``seqcls history``). Never raises."""
    append_event(
        Path(str(release.settings.triton_repository)),
        release.config.model_name,
        "override",
        gate=override["gate"],
        reason=override["reason"],
        verdict=override["verdict"][:2000],
        fingerprint=release.checkpoint.fingerprint,
        workspace=str(release.workspace.root),
    )


def inputs(release: Release, gate: str) -> dict[str, Any]:
    """What a gate step's inputs say about overrides: giving or withdrawing one judges the gate again."""
    cfg = release.config
    return {"override": cfg.override_reason if gate in cfg.overrides else None}


__all__ = [
    "GATES",
    "HOLDING",
    "VERDICTS_KEY",
    "Verdict",
    "inputs",
    "override_for",
    "overrides_of",
    "published",
    "record_override",
    "unverified",
    "verdict",
    "verdicts",
]
