"""Hugging Face PyTorch classifiers (DeBERTa-v2, BERT) through the same gates as PaddleNLP's.

Fast tier: the checkpoint's framework detection and up-front refusals (no torch needed beyond
building the fixtures). Gate tier: export → convert → validate on the real libraries, failing on
perturbed ONNX weights and on a ``tokenizer.json`` edited after training. Integration tier:
``seqcls release`` end to end onto a real local Triton for both architectures, the served
answers compared with the validated ones over gRPC.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seqcls.errors import CheckpointError, GateError
from seqcls.frameworks import TRANSFORMERS, for_checkpoint
from seqcls.localtriton import LocalTriton
from seqcls.release.intake import resolve_checkpoint
from tests.helpers.triton import module_triton

pytest.importorskip("torch", reason="the torch extra (make setup-torch) is not installed")

ROOT = Path(__file__).resolve().parents[1]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")


# ----------------------------------------------------------------------------- fast: the checkpoint


@pytest.mark.parametrize("arch", ["deberta-v2", "bert"])
def test_transformers_checkpoint_is_detected_and_fingerprinted(hf_checkpoints_src: dict[str, Path], arch: str) -> None:
    ckpt = resolve_checkpoint(hf_checkpoints_src[arch])
    assert ckpt.framework == "transformers" and for_checkpoint(ckpt) is TRANSFORMERS
    assert (
        ckpt.architecture
        == {"deberta-v2": "DebertaV2ForSequenceClassification", "bert": "BertForSequenceClassification"}[arch]
    )
    assert ckpt.weights.name == "model.safetensors" and ckpt.num_labels == 7
    assert "tokenizer.json" in ckpt.files and "vocab.txt" in ckpt.files  # both define what is served


def test_paddle_checkpoints_stay_paddle(tiny_checkpoint_src: Path) -> None:
    ckpt = resolve_checkpoint(tiny_checkpoint_src)
    assert ckpt.framework == "paddle" and "tokenizer.json" not in ckpt.files


def test_bad_transformers_checkpoints_name_the_file(hf_checkpoints_src: dict[str, Path], tmp_path: Path) -> None:
    src = hf_checkpoints_src["bert"]

    single = _copy(src, tmp_path / "single")
    _edit_json(single / "config.json", problem_type="single_label_classification")
    with pytest.raises(
        CheckpointError, match=r"config\.json: problem_type is 'single_label_classification'.*multi_label"
    ):
        resolve_checkpoint(single)

    both = _copy(src, tmp_path / "both")
    _edit_json(both / "config.json", paddlenlp_version="3.0.0b4")
    with pytest.raises(CheckpointError, match="both transformers_version and paddlenlp_version"):
        resolve_checkpoint(both)

    pickled = _copy(src, tmp_path / "pickled")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04.")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: beside model\.safetensors — two sets of weights"):
        resolve_checkpoint(pickled)

    tf = _copy(src, tmp_path / "tf")
    (tf / "tf_model.h5").write_bytes(b"\x89HDF")
    with pytest.raises(CheckpointError, match=r"tf_model\.h5: seqcls releases transformers checkpoints from"):
        resolve_checkpoint(tf)

    no_tok = _copy(src, tmp_path / "no-tok")
    (no_tok / "tokenizer.json").unlink()
    (no_tok / "vocab.txt").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer"):
        resolve_checkpoint(no_tok)

    too_big = _copy(src, tmp_path / "too-big")
    _edit_json(too_big / "config.json", vocab_size=50)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: ids up to \d+ but config\.json vocab_size is 50"):
        resolve_checkpoint(too_big)

    arch = _copy(src, tmp_path / "arch")
    _edit_json(arch / "config.json", architectures=["BertForMaskedLM"])
    with pytest.raises(CheckpointError, match="not a sequence classifier"):
        resolve_checkpoint(arch)


def test_tokenizer_config_cannot_point_outside_the_checkpoint(
    hf_checkpoints_src: dict[str, Path], tmp_path: Path
) -> None:
    """transformers reads a ``vocab_file`` / ``tokenizer_file`` that tokenizer_config.json names —
    anywhere on the worker (seen: a slow BertTokenizer built from /tmp/outside_vocab.txt)."""
    outside = tmp_path / "outside_vocab.txt"
    outside.write_text("[PAD]\n[CLS]\n[SEP]\n[UNK]\nOUTSIDE\n", encoding="utf-8")
    for key in ("vocab_file", "tokenizer_file"):
        ckpt = _copy(hf_checkpoints_src["bert"], tmp_path / key)
        _edit_json(ckpt / "tokenizer_config.json", **{key: str(outside)})
        with pytest.raises(CheckpointError, match=rf"tokenizer_config\.json: {key} names .*outside the checkpoint"):
            resolve_checkpoint(ckpt)
    inside = _copy(hf_checkpoints_src["bert"], tmp_path / "inside")
    _edit_json(inside / "tokenizer_config.json", vocab_file="vocab.txt", tokenizer_file=None)
    assert resolve_checkpoint(inside).framework == "transformers"  # a file of its own is fine


# ----------------------------------------------------------------------------- gate: real torch + ORT


def _release(ckpt: Path, model: str, **config):
    from seqcls.config import ReleaseConfig
    from seqcls.release.intake import open_release

    return open_release(ckpt, ReleaseConfig(model_name=model, **config))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["deberta-v2", "bert"])
def test_gate_passes_with_the_graph_and_tokenizer_the_model_takes(
    hf_checkpoints_src: dict[str, Path], arch: str
) -> None:
    import onnx
    import torch

    from seqcls.release.records import ParityReport, model_inputs
    from seqcls.steps import run_release
    from tests.helpers.checkpoints import HF_GOLDEN

    release = _release(hf_checkpoints_src[arch], "hf")
    run_release(release, until="validate")
    expected_inputs = {
        "deberta-v2": ["input_ids", "attention_mask"],
        "bert": ["input_ids", "token_type_ids", "attention_mask"],
    }
    assert model_inputs(release.workspace) == expected_inputs[arch]
    report = ParityReport.load(release.workspace)
    assert report.passed and report.tokenizer["mismatched"] == 0
    assert report.tokenizer["reference"].startswith("transformers BertTokenizer (vocab.txt)")  # the slow tokenizer
    assert report.tokenizer["serving"] == "tokenizer.json"
    assert report.numeric["logits_max_abs_diff"] < 1e-5
    export = release.workspace.step("export")["summary"]
    assert export["framework"] == "transformers" and export["exporter"].startswith("torch.onnx.export")
    assert export["torch"].startswith("2.") and export["transformers"]
    # DeBERTa-v2's scripted relative-position branch is traced away (no If: base-size fusion in minutes),
    # the eager model keeps the original helper, and the parity above holds at the golden texts' lengths
    graph = onnx.load(str(release.workspace.path("onnx/model.onnx")), load_external_data=False).graph
    assert not [n.name for n in graph.node if n.op_type == "If"]
    if arch == "deberta-v2":
        from transformers.models.deberta_v2 import modeling_deberta_v2

        assert isinstance(modeling_deberta_v2.build_rpos, torch.jit.ScriptFunction)
    assert len({len(t) for t in HF_GOLDEN}) > 3  # lengths vary: a baked-in length would show


@pytest.mark.slow
def test_gate_fails_on_perturbed_onnx_weights(hf_checkpoints_src: dict[str, Path]) -> None:
    from seqcls.steps import run_release
    from seqcls.steps.validate import validate
    from tests.helpers.checkpoints import perturb_converted

    release = _release(hf_checkpoints_src["deberta-v2"], "hfperturbed")
    run_release(release, until="convert")
    perturb_converted(release)
    with pytest.raises(GateError) as info:
        validate(release)
    msg = str(info.value)
    assert "Parity gate failed" in msg and "logits max |Δ|" in msg and "Nothing was registered" in msg


@pytest.mark.slow
def test_gate_fails_on_a_tokenizer_file_edited_after_training(
    hf_checkpoints_src: dict[str, Path], tmp_path: Path
) -> None:
    """Someone 'fixes' tokenizer.json after training (two vocabulary entries swapped, lower-casing
    turned off): the slow tokenizer from the trained vocab.txt disagrees with what would be served."""
    from seqcls.steps import run_release

    ckpt = _copy(hf_checkpoints_src["bert"], tmp_path / "edited")
    data = json.loads((ckpt / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    vocab["某"], vocab["球"] = vocab["球"], vocab["某"]
    (ckpt / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    release = _release(ckpt, "hfedited")
    with pytest.raises(GateError) as info:
        run_release(release, until="validate")
    msg = str(info.value)
    assert "tokenizer ids differ on" in msg and "transformers BertTokenizer (vocab.txt)" in msg, msg
    assert "serving tokenizer.json" in msg, msg


# ----------------------------------------------------------------------------- integration: real Triton


root, triton, env = module_triton("hf-release")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize(("arch", "model"), [("deberta-v2", "deberta"), ("bert", "bert")])
def test_release_end_to_end_on_triton(
    env: dict[str, str], triton: LocalTriton, hf_checkpoints_src: dict[str, Path], arch: str, model: str
) -> None:
    from seqcls.contract.names import ModelName
    from seqcls.release.intake import open_release
    from seqcls.release.records import Expected
    from seqcls.serving.client import TritonOps, endpoints_from_settings
    from seqcls.settings import Settings

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "seqcls.cli",
            "release",
            "--checkpoint",
            str(hf_checkpoints_src[arch]),
            "--model-name",
            model,
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    steps = {r["step"]: r["status"] for r in json.loads(out.stdout)["results"]}
    assert steps["smoke"] == "ok" and steps["promote"] == "ok", steps
    # the served answers over gRPC are the validated ones, text by text
    settings = Settings.from_env()
    release = open_release(
        hf_checkpoints_src[arch], settings=settings, config=_release(hf_checkpoints_src[arch], model).config
    )
    expected = Expected.load(release.workspace)
    ops = TritonOps(endpoints_from_settings(settings)[0])
    texts = [item.text for item in expected.items]
    preds, probs = ops.infer(texts, model=ModelName(model).names.ensemble)
    for item, pred, prob in zip(expected.items, preds, probs, strict=True):
        if not item.near_threshold:
            assert sorted(p["label"] for p in pred) == sorted(item.labels), item.text
        assert max(abs(a - b) for a, b in zip(prob, item.probabilities, strict=True)) < expected.prob_atol
    # the served tokenizer and graph are the HF ones, recorded per version
    repo = Path(env["SEQCLS_TRITON_REPOSITORY"])
    info = json.loads((repo / ModelName(model).names.tokenizer / "1" / "release.json").read_text(encoding="utf-8"))
    assert info["framework"] == "transformers" and info["tokenizer_file"] == "tokenizer.json"
    assert info["model_inputs"] == (
        ["input_ids", "attention_mask"] if arch == "deberta-v2" else ["input_ids", "token_type_ids", "attention_mask"]
    )
    assert (repo / ModelName(model).names.tokenizer / "1" / "tokenizer.json").is_file()
    # the registry records the framework, and status agrees
    from seqcls.registry.ledger import CHAMPION, aliased_version, client

    champion = aliased_version(client(settings), model, CHAMPION)
    assert champion is not None and champion.tags["framework"] == "transformers"
    assert champion.tags["version.torch"].startswith("2.")
    # the registered MLflow model answers the same from text (tokenizer.json + attention_mask inside)
    import mlflow

    mlflow.set_tracking_uri(env["SEQCLS_MLFLOW_TRACKING_URI"])
    rows = mlflow.pyfunc.load_model(f"models:/{model}@champion").predict(texts).to_dict("records")
    for item, row in zip(expected.items, rows, strict=True):
        if not item.near_threshold:
            assert row["labels"] == item.labels, item.text
        assert (
            max(abs(a - b) for a, b in zip(row["probabilities"], item.probabilities, strict=True)) < expected.prob_atol
        )
    status = subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "status", "--json"], env=env, capture_output=True, text=True, timeout=300
    )
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
