"""The parity gate's page: the verdict and its reasons, the key figures, the plot, then the details.

Read from the release workspace's ``validate`` record and ``report.json`` (``parity/`` for a passed
gate, ``failed/validate/`` for a failed one): tokenizer ids, logits and probabilities against their
tolerances, label decisions kept. The per-label decision thresholds (one row per label: dozens) and
the task's full error text are folded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqcls.airflow.pages.kit import (
    Link,
    card,
    cards,
    e,
    figure,
    folded,
    foot,
    head,
    rows_table,
    short,
    verdict,
)
from seqcls.release.records import OUT_DIRS, PARITY_PLOT, PARITY_REPORT
from seqcls.release.workspace import Workspace

#: The figures shown in the details table, per report section (the rest are lists or repeat a card).
DETAIL_KEYS = ("texts", "profile", "provider", "golden_source", "seconds", "passed")


def evidence(root: Path) -> dict[str, Any] | None:
    """The validate record, outcome, report and plot path of a workspace (None: no evidence)."""
    ws = Workspace(root)
    record = ws.step("validate")
    if not record or record.get("status") not in ("ok", "failed"):
        return None
    passed = record["status"] == "ok"
    directory = ws.path(OUT_DIRS["validate"]) if passed else ws.failed_dir("validate")
    report_file, plot = directory / Path(PARITY_REPORT).name, directory / Path(PARITY_PLOT).name
    try:
        report = json.loads(report_file.read_text(encoding="utf-8")) if report_file.is_file() else None
    except (OSError, ValueError):  # a damaged report: the page says so rather than failing
        report = None
    if report is None and passed:
        return None
    return {"record": record, "passed": passed, "report": report, "plot": plot if plot.is_file() else None}


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int | str) and len(str(value)) <= 200:
        return str(value)
    return None


def _section(report: dict[str, Any], name: str) -> dict[str, Any]:
    value = report.get(name)
    return value if isinstance(value, dict) else {}


def key_cards(report: dict[str, Any]) -> str:
    """Tokenizer, logits, probabilities, decisions, golden set: measured against allowed, failures marked."""
    tk, nm, dc = (_section(report, s) for s in ("tokenizer", "numeric", "decisions"))
    items = []
    if tk:
        pair = f"{tk.get('reference', 'reference')} vs {tk.get('serving', 'serving')} tokenizer"
        value = f"{tk.get('mismatched', '—')} of {tk.get('texts', '—')} texts differ"
        items.append(card("Tokenizer ids", value, pair, bad=tk.get("passed") is False))
    if nm and nm.get("finite") is False:
        items.append(card("Logits", "NaN or inf", str(nm.get("nan_or_inf", "")), bad=True))
    elif nm:
        gating = nm.get("gating", True)
        allowed = f"allowed {short(nm.get('atol'))} + {short(nm.get('rtol'))}·|x|"
        outside = f"{nm.get('logits_out_of_tolerance', '—')} out of tolerance"
        note = "" if gating else " (reported only: a reduced-precision profile is gated on decisions)"
        bad = gating and nm.get("passed") is False
        items.append(
            card("Logits max |Δ|", short(nm.get("logits_max_abs_diff")), f"{allowed}; {outside}{note}", bad=bad)
        )
        prob = f"{nm.get('prob_out_of_tolerance', '—')} out of tolerance ({nm.get('prob_tolerance', '')})"
        items.append(card("Probabilities max |Δ|", short(nm.get("prob_max_abs_diff")), prob, bad=bad))
    if dc:
        total, changed = dc.get("label_decisions"), dc.get("label_decisions_changed")
        kept = f"{total - changed} of {total} kept" if isinstance(total, int) and isinstance(changed, int) else "—"
        agreement = dc.get("agreement")
        sub = f"agreement {agreement:.2%}" if isinstance(agreement, int | float) else ""
        if "min_agreement" in dc:
            sub += f" (at least {dc['min_agreement']:.2%})"
        sub += f"; {dc.get('changed', '—')} label sets changed, {dc.get('near_threshold', '—')} near a threshold"
        items.append(card("Label decisions", kept, sub, bad=dc.get("passed") is False))
    if report:
        where = f"{report.get('golden_source', '')}; {report.get('profile', '')} on {report.get('provider', '')}"
        items.append(card("Golden texts", str(report.get("texts", "—")), where))
    return cards(items)


def _verdict(found: dict[str, Any], model: str, fingerprint: str) -> str:
    record, report = found["record"], found["report"] or {}
    errors = [str(x) for x in report.get("gate_errors") or []]
    error = str(record.get("error") or "")
    body = f"<p>Model <code>{e(model)}</code>, fingerprint <code>{e(fingerprint[:16])}</code>"
    body += f", profile <code>{e(report.get('profile', ''))}</code>.</p>" if report else ".</p>"
    if found["passed"]:
        body += "<p>Tokenizer ids, logits and label decisions of the served graph match the checkpoint's.</p>"
        return verdict("passed", "Parity gate passed", body)
    body += "".join(f"<p>• {e(x)}</p>" for x in errors)
    if not errors and error:
        body += f"<pre>{e(error)}</pre>"
    if not report:
        body += "<p>The gate failed before it wrote its report.</p>"
    return verdict("failed", "Parity gate FAILED", body)


def _changes(report: dict[str, Any]) -> str:
    """The label sets that changed (the first 20), for a failed gate's reader."""
    changes = [c for c in _section(report, "decisions").get("changes") or [] if isinstance(c, dict)]
    if not changes:
        return ""
    rows = "".join(
        f"<tr><td class='n'>{e(c.get('index'))}</td><td>{e(c.get('text'))}</td>"
        f"<td>{e(', '.join(map(str, c.get('paddle') or [])))}</td>"
        f"<td>{e(', '.join(map(str, c.get('onnxruntime') or [])))}</td>"
        f"<td>{'yes' if c.get('near_threshold') else 'no'}</td></tr>"
        for c in changes[:20]
    )
    head_row = "<tr><th>#</th><th>text</th><th>reference</th><th>ONNX Runtime</th><th>near a threshold</th></tr>"
    more = f" (first 20 of {len(changes)})" if len(changes) > 20 else ""
    return f"<h2>Changed label sets{e(more)}</h2><table class='changes'>{head_row}{rows}</table>"


def details(report: dict[str, Any], record: dict[str, Any]) -> str:
    """Every figure of the report; the thresholds, and the error as the task logged it, folded."""
    rows = [(k, _scalar(report.get(k))) for k in DETAIL_KEYS]
    for section in ("tokenizer", "numeric", "decisions"):
        rows += [(f"{section}.{k}", _scalar(v)) for k, v in _section(report, section).items()]
    shown = [(k, v) for k, v in rows if v is not None]
    parts = [_changes(report), "<h2>All figures</h2>", rows_table(shown, "figures")] if shown else []
    thresholds = _section(report, "thresholds")
    if thresholds:
        table = rows_table([(label, f"{value:g}") for label, value in thresholds.items()], "thresholds")
        parts.append(folded(f"Decision thresholds ({len(thresholds)} labels)", table))
    if record.get("error") and report.get("gate_errors"):
        parts.append(folded("The failure as the task logged it", f"<pre>{e(record['error'])}</pre>"))
    return "".join(parts)


def render(
    found: dict[str, Any], *, dag_id: str, run_id: str, links: Sequence[Link], plot_src: str, model: str = ""
) -> str:
    """The page: verdict, key figures, plot, details (``plot_src`` relative to the page)."""
    report = found["report"] or {}
    model = str(report.get("model_name") or model)
    fingerprint = str(report.get("fingerprint") or "")
    parts = [
        head(f"Parity evidence — {model} — {run_id}", f"{model} · parity gate · run {run_id}", links),
        _verdict(found, model, fingerprint),
        key_cards(report),
    ]
    if found["plot"]:
        parts.append(figure(plot_src, "parity plot: reference vs ONNX Runtime"))
    parts.append(details(report, found["record"]))
    parts.append(f"<p class='muted'>DAG <code>{e(dag_id)}</code>, run <code>{e(run_id)}</code>.</p>")
    return "".join(parts) + foot()


__all__ = ["evidence", "key_cards", "render"]
