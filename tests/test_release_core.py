"""export → convert → validate on real Paddle / paddle2onnx / ONNX Runtime, and the gate failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from seqcls.config import ReleaseConfig
from seqcls.errors import CheckpointError, ConversionError, GateError, StepOrderError
from seqcls.release.intake import open_release
from seqcls.steps import run_release
from tests.helpers.checkpoints import perturb_converted

pytestmark = pytest.mark.slow


def test_release_core_passes_with_figures(tiny_checkpoint: Path, home: Path) -> None:
    release = open_release(tiny_checkpoint)
    results = run_release(release, until="validate")
    assert [r.step for r in results] == ["export", "convert", "validate"]
    assert all(r.status == "ok" for r in results)
    ws = release.workspace
    assert ws.root.parent.parent == home / "releases"
    assert (ws.root / "static" / "float32.json").is_file()
    assert (ws.root / "static" / "float32.pdiparams").is_file()

    import onnx

    model = onnx.load(str(ws.root / "onnx" / "model.onnx"))
    assert [o.name for o in model.graph.output] == ["logits"]
    assert [i.name for i in model.graph.input] == ["input_ids", "token_type_ids"]

    report = json.loads((ws.root / "parity" / "report.json").read_text())
    assert report["passed"] and report["tokenizer"]["mismatched"] == 0
    assert report["texts"] >= 64 and report["golden_source"] == "built-in golden set"
    assert 0 <= report["numeric"]["logits_max_abs_diff"] < 1e-4
    assert report["provider"] == "CPUExecutionProvider"
    assert report["decisions"]["changed_not_near_threshold"] == 0
    assert (ws.root / "parity" / "plot.png").read_bytes()[:4] == b"\x89PNG"
    expected = json.loads((ws.root / "parity" / "expected.json").read_text())
    assert len(expected["items"]) == report["texts"]
    assert expected["labels"][1] == "组织关系##裁员"
    # a predicted child implies its parent (hierarchy consistency)
    for item in expected["items"]:
        for lbl in item["labels"]:
            if "##" in lbl:
                assert lbl.split("##")[0] in item["labels"]

    manifest = json.loads(ws.manifest_path.read_text())
    for step in ("export", "convert", "validate"):
        rec = manifest["steps"][step]
        assert rec["status"] == "ok" and rec["outputs"] and rec["seconds"] > 0
        assert rec["versions"]["paddlepaddle"] == "3.3.1"


def test_rerun_skips_and_changed_inputs_redo(tiny_checkpoint: Path) -> None:
    release = open_release(tiny_checkpoint)
    run_release(release, until="validate")
    again = run_release(open_release(tiny_checkpoint), until="validate")
    assert [r.status for r in again] == ["skipped", "skipped", "skipped"]
    # a new opset changes convert's inputs → convert and validate redo, export stays skipped
    changed = run_release(open_release(tiny_checkpoint, ReleaseConfig(opset=13)), until="validate")
    assert [r.status for r in changed] == ["skipped", "ok", "ok"]
    # damaged output → redone, not trusted
    onnx_file = release.workspace.root / "onnx" / "model.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes()[:100])
    redo = run_release(open_release(tiny_checkpoint, ReleaseConfig(opset=13)), until="validate")
    assert [r.status for r in redo] == ["skipped", "ok", "skipped"]


def test_step_order_is_enforced(tiny_checkpoint: Path) -> None:
    from seqcls.steps.convert import convert

    with pytest.raises(StepOrderError, match="step 'export' has not run"):
        convert(open_release(tiny_checkpoint))


def test_bad_checkpoint_leaves_no_workspace(tiny_checkpoint: Path, home: Path) -> None:
    (tiny_checkpoint / "label.txt").write_text("only-one\n", encoding="utf-8")
    with pytest.raises(CheckpointError):
        open_release(tiny_checkpoint)
    assert not list((home / "releases").glob("*/*/manifest.json")) if (home / "releases").exists() else True


def test_corrupt_params_fail_export_and_are_recorded(tiny_checkpoint: Path) -> None:
    import pickle

    # a complete pickle (passes the cheap check) holding the wrong tensors
    (tiny_checkpoint / "model_state.pdparams").write_bytes(pickle.dumps({"nonsense": np.zeros(3)}, protocol=2))
    release = open_release(tiny_checkpoint)
    with pytest.raises((CheckpointError, ConversionError)):
        run_release(release, until="validate")
    rec = release.workspace.step("export")
    assert rec["status"] == "failed"
    assert not (release.workspace.root / "static").exists()
    with pytest.raises(StepOrderError):
        from seqcls.steps.convert import convert

        convert(release)


def test_gate_fails_on_perturbed_onnx(tiny_checkpoint: Path) -> None:
    release = open_release(tiny_checkpoint)
    run_release(release, until="convert")
    perturb_converted(release)
    from seqcls.steps.validate import validate

    with pytest.raises(GateError) as info:
        validate(release)
    msg = str(info.value)
    assert "Parity gate failed" in msg and "logits max |Δ|" in msg and "Nothing was registered" in msg
    rec = release.workspace.step("validate")
    assert rec["status"] == "failed"
    report = json.loads((release.workspace.root / "failed" / "validate" / "report.json").read_text())
    assert not report["numeric"]["passed"] and report["numeric"]["logits_out_of_tolerance"] > 0
    assert not (release.workspace.root / "parity" / "expected.json").exists()


def test_gate_fails_on_vocab_edited_after_training(tiny_checkpoint: Path) -> None:
    # An editor padded a line with a trailing space: PaddleNLP keeps "公 " as the token, the
    # serving tokenizer trims it, so ids for texts containing 公 differ.
    vocab = (tiny_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    i = vocab.index("公")
    vocab[i] = "公 "
    (tiny_checkpoint / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    release = open_release(tiny_checkpoint)
    with pytest.raises(GateError, match=r"tokenizer ids differ on \d+/65 texts \(first: #0"):
        run_release(release, until="validate")


def test_cli_contract(tiny_checkpoint: Path, home: Path) -> None:
    cmd = [sys.executable, "-m", "seqcls.cli"]
    out = subprocess.run(
        [*cmd, "export", "--checkpoint", str(tiny_checkpoint), "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"workspace: {home}/releases/seqcls/")
    assert "export: ok" in out.stdout
    bad = subprocess.run(
        [*cmd, "convert", "--checkpoint", str(tiny_checkpoint / "nope")], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 1 and "does not exist" in bad.stderr
    bad = subprocess.run(
        [*cmd, "validate", "--checkpoint", str(tiny_checkpoint), "--model-name", "../evil"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "model name '../evil' is not allowed" in bad.stderr
    rel = subprocess.run(
        [*cmd, "release", "--checkpoint", str(tiny_checkpoint), "--until", "validate", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SEQCLS_HOME": str(home)},
    )
    assert rel.returncode == 0, rel.stderr
    data = json.loads(rel.stdout)
    assert [r["status"] for r in data["results"]] == ["skipped", "ok", "ok"]
    # the full release needs a Triton server: without one the message says how to start it
    full = subprocess.run(
        [*cmd, "release", "--checkpoint", str(tiny_checkpoint), "--grpc", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SEQCLS_HOME": str(home)},
    )
    assert full.returncode == 1 and "seqcls triton start" in full.stderr
