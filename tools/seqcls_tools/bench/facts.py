"""What the benchmark reports about a release, read through :mod:`seqcls.release.records` (no JSON keys of its own).

A passed gate's report is :meth:`ParityReport.load`; a failed gate's is the same record read
from the step's ``failed/`` directory (:meth:`Workspace.failed_dir`), so the benchmark can say
*why* a profile was not served.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from seqcls.errors import StepOrderError
from seqcls.release.records import PARITY_REPORT, ParityReport, fp32_onnx, served_onnx
from seqcls.release.workspace import Workspace

#: Facts of the convert step's summary the benchmark tables show (the optimize report included).
CONVERT_FACTS = ("bytes", "opset", "optimize")


def _parity_report_from(path: Path) -> ParityReport | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    names = {f.name for f in fields(ParityReport)}
    return ParityReport(**{k: v for k, v in data.items() if k in names})


def parity_report(ws: Workspace) -> ParityReport | None:
    """The gate's report: the passed one, else the one a failed validate left; None if neither exists."""
    try:
        return ParityReport.load(ws)
    except (StepOrderError, FileNotFoundError):
        return _parity_report_from(ws.failed_dir("validate") / Path(PARITY_REPORT).name)


def gate_facts(report: ParityReport) -> dict[str, Any]:
    """The gate's figures for the results file (decisions and numbers, first five changes)."""
    dc = report.decisions
    return {
        "passed": report.passed,
        "texts": report.texts,
        "logits_max_abs_diff": report.numeric.get("logits_max_abs_diff"),
        "numeric_gating": report.numeric.get("gating"),
        "label_sets_changed": dc.get("changed"),
        "changed_not_near_threshold": dc.get("changed_not_near_threshold"),
        "decision_agreement": dc.get("agreement"),
        "changes": [
            {k: c.get(k) for k in ("index", "paddle", "onnxruntime", "near_threshold")}
            for c in dc.get("changes", [])[:5]
        ],
    }


def convert_facts(ws: Workspace) -> dict[str, Any]:
    """What convert produced: the fp32 and served files' sizes, opset, the optimize report ({} if not converted)."""
    if not ws.succeeded("convert"):
        return {}
    summary = ws.require("convert")["summary"]
    out = {k: summary[k] for k in CONVERT_FACTS if k in summary}
    out["bytes"] = fp32_onnx(ws).stat().st_size
    out["served_bytes"] = served_onnx(ws).stat().st_size
    return out


def smoke_differences(ws: Workspace) -> dict[str, Any]:
    """Split a failed smoke's differences: changed label sets vs probabilities beyond tolerance only."""
    path = ws.failed_dir("smoke") / "smoke.json"
    if not path.is_file():
        return {}
    diffs = [d for r in json.loads(path.read_text(encoding="utf-8")) for d in r.get("differences", [])]
    changed = [d for d in diffs if sorted(d.get("expected", [])) != sorted(d.get("served", []))]
    return {
        "differences": len(diffs),
        "label_sets_changed": len(changed),
        "prob_max_abs_diff": round(max((d.get("prob_max_abs_diff", 0.0) for d in diffs), default=0.0), 6),
        "decisions_as_validated": not changed,
    }
