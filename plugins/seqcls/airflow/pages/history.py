"""A model's serving history in the Airflow UI: what ``seqcls history --json`` prints, as a table.

One row per serving change (a release's candidate, its exposure, the champion move, a rollback, a
withdrawn candidate, a repaired state) and per gate refusal, newest first: when, what, from → to in
both numberings ("Triton v5 (MLflow v1)"), fingerprint, the gates' verdicts, who (user@host, and the
Airflow run), the reason — with links to that run and its evidence pages. Above it, what serves now;
the notes of :func:`seqcls.ops.history.history` (MLflow unreachable, damaged log lines) are never hidden.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from seqcls.airflow.pages.kit import Link, e, foot, head, verdict
from seqcls.ops.history import History, HistoryEntry, who_label

#: Kinds after which the public ensemble serves the entry's ``to`` version.
SERVING_KINDS = ("expose", "rollback", "adopt", "sync-repair")
#: (dag_id, run_id) → the URLs (Airflow run, parity evidence, quality evidence), relative to the page.
RunLinks = Callable[[str, str], tuple[str, str, str]]


@dataclass
class ModelRow:
    """One model of the history index: its release DAG (if Airflow knows one) and its log's entries."""

    name: str
    dag_id: str | None = None
    entries: list[HistoryEntry] = field(default_factory=list)
    note: str = ""


def serving_now(result: History) -> HistoryEntry | None:
    """The latest entry that set what the public ensemble serves (None: nothing recorded yet)."""
    return next((x for x in reversed(result.entries) if x.kind in SERVING_KINDS), None)


def _verdicts(entry: HistoryEntry) -> str:
    if entry.kind == "refused":
        gate = entry.gate or "a"
        return f"<span class='refused'>{e(gate)} gate refused</span>"
    parts = [f"<span class='{e(v)}'>{e(g)} {e(v)}</span>" for g, v in entry.gates.items()]
    return ", ".join(parts)


def _reason(entry: HistoryEntry) -> str:
    if entry.kind == "promote":
        return f"MLflow champion → v{entry.to_mlflow}" if entry.to_mlflow is not None else "MLflow champion moved"
    return entry.reason


def _links(entry: HistoryEntry, run_links: RunLinks, mlflow_version: Callable[[int], str | None]) -> str:
    who: dict[str, Any] = entry.who or {}
    out = []
    if who.get("dag_id") and who.get("run_id"):
        run, parity, quality = run_links(str(who["dag_id"]), str(who["run_id"]))
        out += [f"<a href='{e(run)}'>Airflow run</a>", f"<a href='{e(parity)}'>parity</a>"]
        out.append(f"<a href='{e(quality)}'>quality</a>")
    url = mlflow_version(entry.to_mlflow) if entry.to_mlflow is not None else None
    if url:
        out.append(f"<a href='{e(url)}' rel='noopener noreferrer'>MLflow v{entry.to_mlflow}</a>")
    return " · ".join(out)


def _row(entry: HistoryEntry, registry: bool, run_links: RunLinks, mlflow_version: Callable[[int], str | None]) -> str:
    fp = entry.fingerprint or ""
    cells = [
        f"<td><code>{e(entry.at)}</code></td>",
        f"<td><span class='kind {e(entry.kind)}'>{e(entry.kind)}</span></td>",
        f"<td>{e(entry.change(registry=registry))}</td>",
        f"<td><code title='{e(fp)}'>{e(fp[:12] or '-')}</code></td>",
        f"<td>{_verdicts(entry)}</td>",
        f"<td>{e(who_label(entry.who, entry.by))}</td>",
        f"<td>{e(_reason(entry))}</td>",
        f"<td>{_links(entry, run_links, mlflow_version)}</td>",
    ]
    return f"<tr>{''.join(cells)}</tr>"


def render_history(
    model: str,
    result: History,
    *,
    links: Sequence[Link],
    run_links: RunLinks,
    mlflow_version: Callable[[int], str | None],
) -> str:
    """The page: what serves now, the notes, then every change newest first."""
    now = serving_now(result)
    if now is None:
        summary = verdict("not run", f"{model}: nothing released yet", "<p>No serving change is recorded.</p>")
    else:
        since = f"<p>Since <code>{e(now.at)}</code> ({e(now.kind)} by {e(who_label(now.who, now.by))}).</p>"
        summary = verdict("passed", f"{model} serves {now.describe('to', registry=result.registry)}", since)
    notes = "".join(f"<p class='refused'>note: {e(n)}</p>" for n in result.notes)
    header = "".join(
        f"<th>{h}</th>"
        for h in ("when (UTC)", "what", "from → to", "fingerprint", "verdicts", "who", "reason", "evidence")
    )
    rows = "".join(_row(x, result.registry, run_links, mlflow_version) for x in reversed(result.entries))
    count = len(result.entries)
    table = f"<h2>{count} change{'' if count == 1 else 's'}, newest first</h2>"
    table += f"<table class='history'><tr>{header}</tr>{rows}</table>" if rows else ""
    title = f"History — {model}"
    return head(title, f"{model} · serving history", links) + summary + notes + table + foot()


def _last(row: ModelRow) -> str:
    if not row.entries:
        return e(row.note or "nothing recorded")
    last = row.entries[-1]  # not joined with MLflow (one log read per model): the Triton numbers alone
    change = last.change(registry=False)
    return f"<code>{e(last.at)}</code> <span class='kind {e(last.kind)}'>{e(last.kind)}</span> {e(change)}"


def render_models(
    rows: Sequence[ModelRow], *, links: Sequence[Link], notes: Sequence[str] = (), page_of: Callable[[str], str]
) -> str:
    """The index: every model Airflow has a release DAG for or the repository has a log of."""
    body = "".join(
        f"<tr><td><a href='{e(page_of(r.name))}'>{e(r.name)}</a></td><td><code>{e(r.dag_id or '—')}</code></td>"
        f"<td class='n'>{len(r.entries)}</td><td>{_last(r)}</td></tr>"
        for r in rows
    )
    head_row = "<tr><th>model</th><th>release DAG</th><th>changes</th><th>last change</th></tr>"
    table = f"<table class='models'>{head_row}{body}</table>" if rows else "<p>No model is known yet.</p>"
    intro = "<h1>Serving history</h1><p class='muted'>Every serving change and gate refusal, per model.</p>"
    intro += "".join(f"<p class='refused'>note: {e(n)}</p>" for n in notes)
    return head("Serving history", "seqcls · serving history", links) + intro + table + foot()


__all__ = ["ModelRow", "render_history", "render_models", "serving_now"]
