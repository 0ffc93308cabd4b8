"""The quality gate's page: the verdict (each failed rule with both values), candidate beside champion,
the plot, then per label, the eval set, the bad cases and every check.

When the drops were judged as paired data (:mod:`seqcls.gates.paired`), every compared metric shows
the bounds of its drop, and the verdict names the checks the eval set is too small to decide: a number
without its uncertainty invites reading a one-text difference as a regression, or a real one as none.

Read from the release workspace: ``quality/`` for a passed gate, ``failed/evaluate/`` for a refused
one — only the layout's files (:mod:`seqcls.release.records`), each confined to the workspace (a symlink
out of it is not the layout's file). States: passed, refused, skipped (no eval set), failed (an
error before any verdict), not run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqcls.airflow.pages.kit import Link, e, figure, folded, foot, head, verdict
from seqcls.airflow.pages.kit import number as _number
from seqcls.release.records import BAD_CASES, EVALUATION, OUT_DIRS, QUALITY_PLOT
from seqcls.release.workspace import Workspace

QUALITY_STEP = "evaluate"
#: The headline rows of the quality table: Scores field → what the page calls it.
HEADLINE = (
    ("micro_f1", "micro-F1"),
    ("macro_f1", "macro-F1"),
    ("sample_accuracy", "sample accuracy"),
    ("hierarchical_f1", "hierarchical F1"),
    ("hierarchy_consistency", "hierarchy consistency"),
)
TITLES = {
    "passed": "Quality gate passed",
    "refused": "Quality gate REFUSED the candidate",
    "skipped": "Quality gate skipped",
    "not run": "Quality gate did not run",
    "failed": "Quality gate FAILED before its verdict",
}


def _confined(directory: Path, rel: str, root: Path) -> Path | None:
    """The layout file ``rel`` in ``directory``, if a regular file inside the workspace (no symlink out)."""
    path = (directory / Path(rel).name).resolve()
    return path if path.is_relative_to(root) and path.is_file() else None


def _read_json(path: Path | None) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):  # damaged evidence: the page says it is missing rather than failing
        return None
    return value if isinstance(value, dict) else None


def quality_evidence(root: Path) -> dict[str, Any]:
    """The evaluate record and the gate's files in the workspace ``root`` (resolved), with its state.

    ``state``: ``not run`` (no finished record), ``skipped`` (no eval set), ``passed`` (``quality/``),
    ``refused`` (a verdict in ``failed/evaluate/``) or ``failed`` (an error before any verdict).
    """
    ws = Workspace(root)
    record = ws.step(QUALITY_STEP)
    status = (record or {}).get("status")
    found: dict[str, Any] = {"record": record, "evaluation": None, "plot": None, "bad_cases": None}
    if status not in ("ok", "failed"):
        return found | {"state": "not run"}
    directory = ws.path(OUT_DIRS[QUALITY_STEP]) if status == "ok" else ws.failed_dir(QUALITY_STEP)
    found |= {k: _confined(directory, rel, root) for k, rel in (("plot", QUALITY_PLOT), ("bad_cases", BAD_CASES))}
    evaluation = found["evaluation"] = _read_json(_confined(directory, EVALUATION, root))
    scored = bool(evaluation and isinstance(evaluation.get("candidate"), dict))
    if status == "ok":
        state = "passed" if scored or evaluation is None else "skipped"
    else:
        state = "refused" if scored else "failed"
    return found | {"state": state}


def _delta(candidate: Any, champion: Any) -> tuple[float | None, str]:
    """candidate − champion and its cell (red when worse, green when better; — when either is missing)."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (candidate, champion))
    if not numbers or math.isnan(candidate - champion):
        return None, "<td class='n muted'>—</td>"
    d = float(candidate - champion)
    kind = "worse" if d < -1e-9 else "better" if d > 1e-9 else "same"
    return d, f"<td class='n {kind}'>{d:+.4f}</td>" if kind != "same" else "<td class='n same'>0</td>"


def _champion_name(evaluation: dict[str, Any]) -> str:
    version = evaluation.get("champion_version")
    return f"champion (Triton v{version})" if version is not None else "champion (none: first release)"


def _checks_by_rule(evaluation: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each check of ``evaluation`` by (rule, metric)."""
    checks = [c for c in evaluation.get("checks") or [] if isinstance(c, dict)]
    return {(str(c.get("rule")), str(c.get("metric"))): c for c in checks}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bounds(check: dict[str, Any] | None) -> str:
    """``-0.0042 … 0.0120`` (the drop's bounds from the paired test), — without them."""
    if not check or not (_is_number(check.get("lower")) and _is_number(check.get("upper"))):
        return "—"
    return f"{_number(check['lower'])} … {_number(check['upper'])}"


def _judgement(check: dict[str, Any] | None) -> str:
    """Whether the drop is over the threshold beyond noise, and whether the eval set is too small for the check."""
    if not check or not isinstance(check.get("significant"), bool):
        return ""
    said = "over the threshold beyond noise" if check["significant"] else "not beyond noise"
    return said + ("; eval set too small" if check.get("too_small") else "")


def _interval_cells(check: dict[str, Any] | None) -> str:
    kind = " small" if check and check.get("too_small") else ""
    return f"<td class='n{kind}'>{e(_bounds(check))}</td><td>{e(_judgement(check))}</td>"


def _confidence(evaluation: dict[str, Any]) -> str:
    paired = evaluation.get("paired") if isinstance(evaluation.get("paired"), dict) else {}
    conf = paired.get("confidence")
    return f"{conf:.0%}" if _is_number(conf) else "95%"


def _failures_table(failures: list[Any], evaluation: dict[str, Any]) -> str:
    rows = []
    checks = _checks_by_rule(evaluation)
    for f in (f for f in failures if isinstance(f, dict)):
        fp32 = f.get("rule") == "max_profile_f1_drop"  # that rule's baseline is the fp32 graph, not the champion
        champion = _number(f.get("champion")) + (" (fp32 graph)" if fp32 else "")
        if f.get("champion") is None:
            champion = "— (a floor)"
        rows.append(
            f"<tr><td>{e(str(f.get('rule')))}</td><td>{e(str(f.get('metric')))}</td>"
            f"<td class='n'>{_number(f.get('candidate'))}</td><td class='n'>{e(champion)}</td>"
            f"<td class='n'>{_number(f.get('threshold'))}</td>"
            f"{_interval_cells(checks.get((str(f.get('rule')), str(f.get('metric')))))}</tr>"
        )
    head_row = (
        "<tr><th>rule</th><th>metric</th><th>candidate</th><th>champion</th><th>threshold</th>"
        f"<th>drop, {_confidence(evaluation)} bounds</th><th></th></tr>"
    )
    return f"<table class='failures'>{head_row}{''.join(rows)}</table>" if rows else ""


def _evidence_note(evaluation: dict[str, Any]) -> str:
    """How the drops were judged (paired test or thresholds alone) and the checks the eval set is too small for."""
    if not isinstance(evaluation.get("champion"), dict):
        return ""
    paired = evaluation.get("paired")
    if not isinstance(paired, dict):
        return (
            "<p class='muted'>Judged on the scores alone: each change rule is its threshold "
            "(no paired test of the per-text answers).</p>"
        )
    how = (
        f"<p class='muted'>Drops judged as paired data: {e(str(paired.get('method', 'paired bootstrap')))} over the "
        f"{e(_number(paired.get('texts')))} texts ({e(_number(paired.get('resamples')))} resamples, "
        f"one-sided {_confidence(evaluation)} bounds of each drop); a drop refuses only when it is over its "
        "threshold beyond noise (its lower bound above the threshold).</p>"
    )
    small = [str(s) for s in evaluation.get("too_small") or []]
    if not small:
        return how
    items = "".join(f"<li>{e(s)}</li>" for s in small)
    return (
        f"{how}<div class='too-small'><p><b>The eval set is too small to tell whether the drop is over the "
        f"threshold for {len(small)} check{'' if len(small) == 1 else 's'}:</b></p><ul>{items}</ul>"
        "<p>A larger eval set decides them.</p></div>"
    )


def _verdict(found: dict[str, Any]) -> str:
    """The answer first: passed / refused (each failed rule) / skipped / did not run / failed."""
    state = found["state"]
    record, evaluation = found["record"] or {}, found["evaluation"] or {}
    parts: list[str] = []
    skipped = [str(s) for s in evaluation.get("skipped") or []]
    if state == "not run":
        parts.append(
            "<p>The release's workspace has no finished <code>evaluate_quality</code> record: the task has not "
            "run for this release yet, or an earlier task failed.</p>"
        )
    elif state == "skipped":
        why = skipped or [str((record.get("summary") or {}).get("skipped") or "no eval set")]
        return verdict(state, TITLES[state], "".join(f"<p class='skipped'>skipped: {e(w)}</p>" for w in why))
    elif state == "failed":
        parts.append(f"<pre>{e(record.get('error') or '')}</pre>")
    checks = evaluation.get("checks")
    if state == "passed" and isinstance(checks, list):  # its summary repeats the skipped rules listed below
        passed = f"{len(checks)} check{'' if len(checks) == 1 else 's'} passed." if checks else "No rule applied."
        parts.append(f"<p>{passed}</p>")
    elif evaluation.get("summary"):
        parts.append(f"<p>{e(evaluation['summary'])}</p>")
    parts.append(_failures_table(evaluation.get("failures") or [], evaluation))
    parts.append(_evidence_note(evaluation))
    if state == "passed" and not evaluation:
        parts.append(f"<p class='muted'>{e(EVALUATION)} is missing from the workspace.</p>")
    parts += [f"<p class='skipped'>• {e(s)}</p>" for s in skipped]
    return verdict(state, TITLES[state], "".join(parts))


def _context(dag_id: str, run_id: str, evaluation: dict[str, Any]) -> str:
    facts = [("model", evaluation.get("model_name")), ("fingerprint", str(evaluation.get("fingerprint") or "")[:16])]
    facts += [("profile", evaluation.get("profile")), ("DAG", dag_id), ("run", run_id)]
    shown = ", ".join(f"{label} <code>{e(v)}</code>" for label, v in facts if v)
    return f"<p class='muted'>{shown}</p>"


def _headline_rows(evaluation: dict[str, Any]) -> list[tuple[str, str, Any, Any, Any]]:
    """(metric as the rules name it, what, candidate, champion, fp32) per headline metric, then micro/macro-F1
    per level."""
    scores = [
        evaluation.get(who) if isinstance(evaluation.get(who), dict) else {}
        for who in ("candidate", "champion", "fp32")
    ]
    rows = [(key, label, *(s.get(key) for s in scores)) for key, label in HEADLINE]
    levels = sorted({str(lv) for s in scores for lv in (s.get("per_level") or {})}, key=lambda v: (len(v), v))
    for level in levels:
        for key, label in (("micro_f1", "micro-F1"), ("macro_f1", "macro-F1")):
            values = ((s.get("per_level") or {}).get(level, {}).get(key) for s in scores)
            rows.append((f"level_{level}.{key}", f"level {level} {label}", *values))
    return rows


#: The rules whose checks carry the interval of a headline row's drop (absolute drops).
_DROP_RULES = ("max_f1_drop", "max_level_f1_drop", "max_label_f1_drop")


def _drop_check(checks: dict[tuple[str, str], dict[str, Any]], metric: str) -> dict[str, Any] | None:
    return next((checks[(rule, metric)] for rule in _DROP_RULES if (rule, metric) in checks), None)


def _headline_table(evaluation: dict[str, Any]) -> str:
    fp32 = isinstance(evaluation.get("fp32"), dict)
    checks = _checks_by_rule(evaluation)
    paired = isinstance(evaluation.get("paired"), dict)
    head_row = f"<tr><th>metric</th><th>candidate</th><th>{e(_champion_name(evaluation))}</th><th>Δ</th>"
    head_row += f"<th>drop, {_confidence(evaluation)} bounds</th><th></th>" if paired else ""
    head_row += "<th>fp32 graph</th></tr>" if fp32 else "</tr>"
    body = []
    for key, label, cand, champ, full in _headline_rows(evaluation):
        extra = f"<td class='n'>{_number(full)}</td>" if fp32 else ""
        cells = f"<td class='n'>{_number(cand)}</td><td class='n'>{_number(champ)}</td>{_delta(cand, champ)[1]}"
        cells += _interval_cells(_drop_check(checks, key)) if paired else ""
        body.append(f"<tr><th align='left'>{e(label)}</th>{cells}{extra}</tr>")
    texts = (evaluation.get("candidate") or {}).get("texts")
    title = f"<h2>Candidate vs champion on {e(_number(texts))} texts</h2>"
    return f"{title}<table class='headline'>{head_row}{''.join(body)}</table>"


def _label_rows(evaluation: dict[str, Any]) -> list[tuple[float | None, str, Any, Any, Any, str]]:
    """(Δ, label, support, candidate F1, champion F1, Δ cell), worst Δ first; no champion: lowest F1 first."""
    cand = (evaluation.get("candidate") or {}).get("per_label") or {}
    champ = (evaluation.get("champion") or {}).get("per_label") or {}
    rows = []
    for label in dict.fromkeys([*cand, *champ]):
        c, ch = cand.get(label) or {}, champ.get(label) or {}
        if not any((c.get("support"), c.get("predicted"), ch.get("support"), ch.get("predicted"))):
            continue  # in neither the gold sets nor any prediction: says nothing about either model
        d, cell = _delta(c.get("f1"), ch.get("f1"))
        rows.append((d, str(label), c.get("support", ch.get("support")), c.get("f1"), ch.get("f1"), cell))

    def worst_first(row: tuple) -> tuple:
        d, label, _support, f1 = row[:4]
        f1 = f1 if isinstance(f1, int | float) else math.inf
        return (d is None, d if d is not None else f1, label)

    return sorted(rows, key=worst_first)


def _label_table(evaluation: dict[str, Any]) -> str:
    rows = _label_rows(evaluation)
    champion = e(_champion_name(evaluation))
    checks = _checks_by_rule(evaluation)
    paired = isinstance(evaluation.get("paired"), dict)
    bounds = f"<th>drop, {_confidence(evaluation)} bounds</th><th></th>" if paired else ""
    head_row = f"<tr><th>label</th><th>support</th><th>candidate F1</th><th>{champion} F1</th><th>Δ</th>{bounds}</tr>"
    body = "".join(
        f"<tr><td>{e(label)}</td><td class='n'>{_number(support)}</td><td class='n'>{_number(c)}</td>"
        f"<td class='n'>{_number(ch)}</td>{cell}"
        f"{_interval_cells(_drop_check(checks, f'label[{label}].f1')) if paired else ''}</tr>"
        for _d, label, support, c, ch, cell in rows
    )
    return f"<h2>Per label ({len(rows)}), worst Δ first</h2><table class='labels'>{head_row}{body}</table>"


def _eval_set(evaluation: dict[str, Any]) -> str:
    es = evaluation.get("eval_set") or {}
    sha = str(es.get("sha256") or "")
    rows = [
        ("path", f"<code>{e(str(es.get('path', '')))}</code>"),
        ("texts", e(_number(es.get("texts")))),
        ("sha256", f"<code title='{e(sha)}'>{e(sha[:12])}</code>"),
        ("format", e(str(es.get("format", "")))),
        ("came from", e(str(es.get("source", "")))),
    ]
    disagree = evaluation.get("champion_disagreements")
    if isinstance(disagree, int):
        rows.append(("label sets differing from the champion's", e(str(disagree))))
    cells = "".join(f"<tr><th align='left'>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<h2>Eval set</h2><table class='evalset'>{cells}</table>"


def _checks(evaluation: dict[str, Any]) -> str:
    """Every check the gate made with its threshold (and its drop's bounds), folded: what passed is evidence too."""
    checks = [c for c in evaluation.get("checks") or [] if isinstance(c, dict)]
    if not checks:
        return ""
    rows = "".join(
        f"<tr><td>{e(c.get('rule'))}</td><td>{e(c.get('metric'))}</td>"
        f"<td class='n'>{_number(c.get('candidate'))}</td><td class='n'>{_number(c.get('champion'))}</td>"
        f"<td class='n'>{_number(c.get('threshold'))}</td>{_interval_cells(c)}"
        f"<td>{'passed' if c.get('passed') else 'FAILED'}</td></tr>"
        for c in checks
    )
    head_row = (
        "<tr><th>rule</th><th>metric</th><th>candidate</th><th>baseline</th><th>threshold</th>"
        f"<th>drop, {_confidence(evaluation)} bounds</th><th></th><th></th></tr>"
    )
    return folded(f"All {len(checks)} checks and their thresholds", f"<table class='checks'>{head_row}{rows}</table>")


def _bad_cases(found: dict[str, Any], base: str) -> str:
    if not found["bad_cases"]:
        return ""
    count = (found["evaluation"] or {}).get("bad_cases")
    what = f" — {e(_number(count))} texts the candidate got wrong" if isinstance(count, int) else ""
    return f"<p><a href='{e(base)}/bad_cases.tsv'>bad_cases.tsv</a>{what}</p>"


def render_quality(
    found: dict[str, Any], *, dag_id: str, run_id: str, links: Sequence[Link], base: str, model: str = ""
) -> str:
    """The page: verdict, candidate vs champion, plot, then per label, eval set, bad cases, every check;
    ``base`` is the run's segment, so ``{base}/labels.png`` resolves under the page."""
    evaluation = found["evaluation"] or {}
    model = str(evaluation.get("model_name") or model)
    parts = [
        head(f"Quality evidence — {model} — {run_id}", f"{model} · quality gate · run {run_id}", links),
        _verdict(found),
        _context(dag_id, run_id, evaluation),
    ]
    scored = isinstance(evaluation.get("candidate"), dict)
    if scored:
        parts.append(_headline_table(evaluation))
    if found["plot"]:
        parts.append(figure(f"{base}/labels.png", "F1 per label, candidate vs champion"))
    if scored:
        parts += [_label_table(evaluation), _eval_set(evaluation), _bad_cases(found, base), _checks(evaluation)]
    else:
        parts.append(_bad_cases(found, base))
    record = found["record"] or {}
    if found["state"] == "refused" and record.get("error"):
        parts.append(folded("The refusal as the task logged it", f"<pre>{e(record['error'])}</pre>"))
    return "".join(parts) + foot()


__all__ = ["HEADLINE", "QUALITY_STEP", "quality_evidence", "render_quality"]
