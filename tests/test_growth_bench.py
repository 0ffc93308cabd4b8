"""The growth benchmark's plumbing (``seqcls_tools.bench.growth``): the day plan, the ratios and the report on
made-up figures; and (slow) a 3-day run through the real CLI, Triton and MLflow. Not a timed test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqcls_tools.bench import growth


def test_every_10th_day_is_refused_and_every_30th_rolled_back() -> None:
    plan = {day: growth._day_action(day) for day in range(1, 91)}
    assert [d for d, a in plan.items() if a == "rollback"] == [30, 60, 90]
    assert [d for d, a in plan.items() if a == "refused"] == [10, 20, 40, 50, 70, 80]
    assert plan[1] == plan[29] == "release"


def _point(day: int, seconds: float, disk: int) -> dict:
    keys = ("workspaces_heavy", "workspaces_evidence", "workspaces_failed", "triton", "mlflow_artifacts", "mlflow_db")
    return {
        "day": day,
        "disk": {**dict.fromkeys(keys, disk), "workspaces": day},
        "disk_total": 6 * disk,
        "mlflow": {"versions": day, "archived": day - 1},
        "logs": {"state_log": 1000 * day, "registry_journal": 10, "monitor": 0},
        "seconds": {c: seconds for c in growth.COMMANDS},
    }


def test_ratios_are_against_day_1_of_the_same_run_and_the_report_shows_them() -> None:
    points = [_point(1, 2.0, 100), _point(30, 2.2, 150), _point(100, 3.0, 150)]
    ratios = growth._ratios(points)
    assert ratios["30"]["status"] == 1.1 and ratios["100"]["release"] == 1.5 and ratios["100"]["disk_total"] == 1.5
    machine = {"cpu_model": "X", "cpus_usable": 2, "isa": {"avx2": True}}
    results = {"config": {"days": 100}, "machine": machine, "loadavg": {"start": [1], "end": [1]}, "wall_seconds": 1}
    text = growth.markdown({**results, "points": points, "ratios": ratios})
    assert "| 100 | 1.50 | 1.50 |" in text and "CPU X (2 usable CPUs; avx2 yes)" in text, text


@pytest.mark.slow
@pytest.mark.integration
def test_a_three_day_run_writes_its_results_and_plot(tmp_path: Path) -> None:
    cfg = growth.GrowthConfig(days=3, out=tmp_path / "out", repeats=1, checkpoint_days=(1, 3))
    results = growth.run_growth(cfg)
    assert [p["day"] for p in results["points"]] == [1, 3]
    assert [(d["action"], d["exit_code"]) for d in results["days"]] == [("release", 0)] * 3
    day3 = results["points"][1]
    assert day3["mlflow"]["versions"] == 3 and day3["logs"]["state_log"] > 0 and day3["seconds"]["status"] > 0
    assert set(results["ratios"]["3"]) >= {"status", "history", "sync", "noop_release", "release", "disk_total"}
    assert json.loads((cfg.out / "results.json").read_text())["points"] and (cfg.out / "growth.png").stat().st_size


def test_read_cost_reads_the_live_log_and_one_snapshot_after_rotations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQCLS_STATELOG_ROTATE_BYTES", "20000")  # a segment every ~40 releases
    out = growth.read_cost(130, rounds=1)
    assert out["segments"] >= 3, out
    assert out["live_bytes"] < out["read_log"]["bytes_read"] < out["live_bytes"] + 50_000, out  # + the snapshot
    assert out["history_limit_20"]["bytes_read"] < out["live_bytes"] + 100_000, out  # at most a segment more
