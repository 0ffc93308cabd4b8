"""An outcome as a notification: a title that says what happened to which model, a short plain-text body
with the reason first, then the facts (versions in the one vocabulary, gates, what serves now, who, links).

Plain text because every Apprise service takes it (email, chat, webhooks); short because it is read
on a phone. The details stay where they are kept: the workspace, MLflow, the Airflow run.
"""

from __future__ import annotations

from seqcls.notify.outcome import (
    APPROVAL,
    FAILED,
    PREFLIGHT,
    PROMOTED,
    REFUSED,
    ROLLED_BACK,
    UNDO_FAILED,
    UNDONE,
    Outcome,
)

#: Every title starts with this, so a mail filter or a chat search finds the release messages.
TITLE_PREFIX = "[seqcls]"


def headline(o: Outcome) -> str:
    """What happened, in a few words: ``Triton v5 (MLflow v4) promoted``, ``refused by the quality gate``."""
    if o.kind == PROMOTED:
        return f"{o.release_label()} promoted"
    if o.kind == REFUSED:
        if o.gate == PREFLIGHT:
            return "release refused at preflight"
        if o.gate == APPROVAL:
            return "release not approved"
        return f"release refused by the {o.gate} gate" if o.gate else f"release refused at {o.step}"
    if o.kind == FAILED:
        where = f" at {o.step}" if o.step else ""
        undo = ""
        if o.rollback == UNDONE:
            undo = "; candidate withdrawn" if o.triton_version is not None else "; its registry changes undone"
        elif o.rollback == UNDO_FAILED:
            undo = "; its rollback failed too"
        return f"release failed{where}{undo}"
    if o.kind == ROLLED_BACK:
        if o.serving == o.previous and o.triton_version is not None:  # an in-flight release withdrawn
            return f"candidate {o.release_label()} withdrawn"
        return f"rolled back to {o.serving_label()}"
    return "nothing released (already the champion)"


def lead(o: Outcome) -> str:
    """The body's first line: the reason (refused, failed), or what changed (promoted, rolled back)."""
    if o.reason:
        return o.reason
    if o.kind == PROMOTED:
        before = f"; before: {o.previous_label()}" if o.previous not in (None, o.triton_version) else ""
        champion = f"MLflow champion → v{o.mlflow_version}" if o.mlflow_version else "MLflow champion moved"
        return f"{o.model} serves {o.release_label()}; {champion}{before}."
    if o.kind == ROLLED_BACK and o.serving == o.previous:
        return f"{o.model}'s candidate {o.release_label()} was withdrawn; {o.serving_label()} still serves."
    if o.kind == ROLLED_BACK:
        return f"{o.model} serves {o.serving_label()} again (was {o.previous_label()})."
    return "no reason was recorded; see the run's log."


def facts(o: Outcome) -> list[str]:
    """The lines after the reason: only what is known."""
    out = []
    if o.fingerprint or o.triton_version is not None or o.checkpoint:
        parts = [o.release_label()] if o.triton_version is not None else []
        parts += [f"fingerprint {o.fingerprint}"] if o.fingerprint else []
        parts += [f"checkpoint {o.checkpoint}"] if o.checkpoint else []
        out.append("release: " + ", ".join(parts))
    if o.gates:
        out.append("gates: " + ", ".join(f"{gate} {verdict}" for gate, verdict in o.gates.items()))
    if o.kind in (REFUSED, FAILED) and o.step:
        out.append(f"stopped at: {o.step}")
    if o.rollback == UNDONE:
        out.append("rollback: this attempt was undone (candidate withdrawn, its registry changes reverted)")
    elif o.rollback == UNDO_FAILED:
        out.append("rollback: FAILED — check `seqcls status` and `seqcls sync`")
    if o.kind == ROLLED_BACK:
        out.append(f"serving now: {o.serving_label()} (before: {o.previous_label()})")
    elif o.kind != PROMOTED:
        out.append(f"serving now: {o.serving_label()}" if o.serving is not None else "serving now: nothing recorded")
    who = "@".join(p for p in (o.user, o.host) if p)
    if who or o.via:
        out.append(f"by: {who}" + (f" via {o.via}" if o.via else ""))
    out += [f"{label}: {url}" for label, url in o.links.items()]
    return out


def render(o: Outcome) -> tuple[str, str]:
    """``(title, body)`` of the notification for ``o``."""
    title = f"{TITLE_PREFIX} {o.model}: {headline(o)}"
    return title, "\n".join([lead(o), "", *facts(o)])


__all__ = ["TITLE_PREFIX", "facts", "headline", "lead", "render"]
