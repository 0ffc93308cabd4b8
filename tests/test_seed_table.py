"""The seed's table on the trained demo model: every row served for real and scored on labeled texts.

One run of :mod:`seqcls_tools.bench.seed_table` with short budgets (the figures are not checked: this
machine is shared). What is checked is what the table claims: each Triton row's labeled scores are
those of the answers it served, the quality gate's offline scoring of the same published graph gives
the same answers, and rows serving the same fp32 graph answer alike however requests are batched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.demo_models import quick_demo_model

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_seed_table_on_the_demo_model_scores_what_each_row_served(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from seqcls.gates.metrics import score
    from seqcls_tools.bench import seed_table

    checkpoint = quick_demo_model(tmp_path_factory).path
    lines = seed_table.DEMO_TEST_SET.read_text(encoding="utf-8").splitlines()
    eval_set = tmp_path / "eval.jsonl"
    eval_set.write_text("\n".join(lines[::4]) + "\n", encoding="utf-8")  # 60 of the 240 held-out texts
    gold = [json.loads(line)["labels"] for line in lines[::4]]

    results = seed_table.run(checkpoint, eval_set, tmp_path / "work", clients=2, seconds=0.5)

    rows, skipped = seed_table.host_rows()  # bf16 only on a CPU with bf16 arithmetic
    assert [r.name for r in rows] + list(skipped) == [r.name for r in seed_table.ROWS]
    assert results["skipped"] == skipped
    names = [seed_table.FRAMEWORK, *(r.name for r in rows)]
    assert list(results["rows"]) == names
    for name, row in results["rows"].items():
        assert len(row["answers"]) == len(gold) == results["eval_set"]["texts"], name
        expected = score(gold, row["answers"], results["labels"])
        assert row["scores"]["micro_f1"] == round(expected.micro_f1, 4), name
        assert row["requests"] > 0 and row["failed"] == 0 and row["qps"] > 0 and row["p95_ms"] > 0, (name, row)
        assert row["memory_mb"] > 0, name
        assert row["delta_micro_f1_vs_framework"] == round(
            row["scores"]["micro_f1"] - results["rows"][seed_table.FRAMEWORK]["scores"]["micro_f1"], 4
        )
    triton = {n: r for n, r in results["rows"].items() if n != seed_table.FRAMEWORK}
    for name, row in triton.items():
        assert row["differing_from_offline"] == 0, name  # the gate scores what Triton serves
        assert row["offline_scores"] == row["scores"], name
    fp32 = [r["answers"] for r in triton.values() if r["profile"] == "fp32"]
    assert len(fp32) == 3 and fp32[0] == fp32[1] == fp32[2]
    assert results["rows"][seed_table.FRAMEWORK]["scores"]["micro_f1"] > 0.8  # a trained model, not noise

    table = seed_table.table(results)
    assert table.startswith("*Conditions:* CPU ")
    for name in [*names, *skipped]:
        assert sum(line.startswith(f"| {name} |") for line in table.splitlines()) == 1, name
    classic = results["rows"][seed_table.CLASSIC_ROW]["qps"]
    fp32_row = next(line for line in table.splitlines() if line.startswith(f"| {seed_table.FP32_ROW} |"))
    assert f"{results['rows'][seed_table.FP32_ROW]['qps'] / classic:.2f}×" in fp32_row and "+0.0000" in fp32_row
