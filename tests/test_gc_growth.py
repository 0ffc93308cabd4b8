"""The growth benchmark counts what the evidence horizon leaves: the compacted releases' audit records are bytes
in the day's total, the number of compacted releases is not."""

from __future__ import annotations

from seqcls_tools.bench import growth


def test_audit_records_count_in_the_total_and_the_report_shows_compacted_releases() -> None:
    keys = ("workspaces_heavy", "workspaces_evidence", "workspaces_failed", "triton", "mlflow_artifacts", "mlflow_db")
    disk = {**dict.fromkeys(keys, 1_000_000), "workspaces": 30, "compacted": 90, "audit_records": 450_000}
    assert growth._total(disk) == 6_450_000
    point = {
        "day": 120,
        "disk": disk,
        "disk_total": growth._total(disk),
        "mlflow": {"versions": 112, "archived": 107},
        "logs": {"state_log": 1000, "registry_journal": 10, "monitor": 0},
        "seconds": {c: 1.0 for c in growth.COMMANDS},
    }
    machine = {"cpu_model": "X", "cpus_usable": 2, "isa": {"avx2": True}}
    results = {"config": {"days": 120}, "machine": machine, "loadavg": {"start": [1], "end": [1]}, "wall_seconds": 1}
    text = growth.markdown({**results, "points": [point], "ratios": {}})
    assert "| 90 (0.45) |" in text and "compacted (audit MB)" in text, text
