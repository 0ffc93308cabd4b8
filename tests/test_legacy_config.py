"""PaddleNLP 2.x checkpoints: the model config saved as ``model_config.json`` (issue 42).

PaddleNLP up to 2.5 named the file ``model_config.json`` (PaddleNLP 3 still reads it when
``config.json`` is absent: ``LEGACY_CONFIG_NAME``), in one of two layouts, built here byte for byte
as those versions' own code wrote them (old PaddleNLP cannot run beside Paddle 3 here):

- **nested** (models without a config class, PaddleNLP ≤ 2.4): ``InitTrackerMeta`` records a model's
  ``__init__`` keywords, its positional arguments as ``init_args`` and its class as ``init_class``;
  ``save_model_config`` writes them with ``json.dumps(model_config, ensure_ascii=False, indent=2)``,
  the base ``ErnieModel``'s own record (with its ``init_class``) as the first ``init_args`` entry;
- **flat** (models with a config class, 2.4.x–2.5): ``PretrainedConfig.to_json_string`` —
  ``json.dumps(config, indent=2, sort_keys=True) + "\\n"``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seqcls.checkpoints.checkpoint import flatten_legacy_config
from seqcls.errors import CheckpointError
from seqcls.release.intake import resolve_checkpoint
from tests.helpers.drills import Drill, champion

#: The keywords PaddleNLP 2.4's ErnieModel was built with (its pretrained_init_configuration's keys).
ERNIE_INIT_KEYS = (
    "attention_probs_dropout_prob",
    "hidden_act",
    "hidden_dropout_prob",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "task_type_vocab_size",
    "type_vocab_size",
    "use_task_id",
    "vocab_size",
    "pad_token_id",
)


def nested_layout(config: dict) -> str:
    """What PaddleNLP 2.4 wrote for ``ErnieForSequenceClassification.from_pretrained(..., num_classes=N)``."""
    base = {key: config[key] for key in ERNIE_INIT_KEYS}
    base["init_class"] = "ErnieModel"
    num_classes = len(config["id2label"])
    outer = {"num_classes": num_classes, "init_args": [base], "init_class": "ErnieForSequenceClassification"}
    return json.dumps(outer, ensure_ascii=False, indent=2)


def flat_layout(config: dict) -> str:
    """What PaddleNLP 2.5's ``PretrainedConfig.save_pretrained`` wrote (its version key as 2.5 did)."""
    return json.dumps({**config, "paddlenlp_version": "2.5.2"}, indent=2, sort_keys=True) + "\n"


def legacy_checkpoint(src: Path, dst: Path, layout) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text(encoding="utf-8"))
    (dst / "config.json").unlink()
    (dst / "model_config.json").write_text(layout(config), encoding="utf-8")
    return dst


@pytest.fixture(params=[nested_layout, flat_layout], ids=["nested-2.4", "flat-2.5"])
def legacy(request: pytest.FixtureRequest, tiny_checkpoint_src: Path, tmp_path: Path) -> Path:
    return legacy_checkpoint(tiny_checkpoint_src, tmp_path / "legacy", request.param)


def test_a_model_config_json_checkpoint_resolves_like_its_config_json_twin(
    legacy: Path, tiny_checkpoint_src: Path
) -> None:
    ckpt, twin = resolve_checkpoint(legacy), resolve_checkpoint(tiny_checkpoint_src)
    assert (ckpt.num_labels, ckpt.vocab_size, ckpt.max_position_embeddings, ckpt.architecture) == (
        twin.num_labels,
        twin.vocab_size,
        twin.max_position_embeddings,
        "ErnieForSequenceClassification",
    )
    assert ckpt.framework == "paddle" and ckpt.config_file == legacy / "model_config.json"
    assert "model_config.json" in ckpt.files and "config.json" not in ckpt.files  # fingerprinted like config.json
    assert ckpt.fingerprint != twin.fingerprint


def test_errors_name_the_file_the_user_has(legacy: Path) -> None:
    (legacy / "label.txt").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"2 labels but model_config\.json says the model has 7"):
        resolve_checkpoint(legacy)


def test_both_config_files_are_refused_when_they_differ(legacy: Path) -> None:
    text = (legacy / "model_config.json").read_text(encoding="utf-8")
    (legacy / "config.json").write_text(text, encoding="utf-8")
    resolve_checkpoint(legacy)  # the same bytes twice: one model, whoever reads it
    (legacy / "config.json").write_text(text.rstrip() + "\n\n", encoding="utf-8")  # one byte differs
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(legacy)
    assert f"{legacy / 'config.json'} and {legacy / 'model_config.json'}: both present and different" in str(err.value)


def test_a_modelscope_layout_says_what_a_classifier_release_needs(tmp_path: Path) -> None:
    root = tmp_path / "nlp_deberta_rex-uninlu_chinese-base"
    root.mkdir()
    (root / "configuration.json").write_text('{"framework": "pytorch", "task": "rex-uninlu"}', encoding="utf-8")
    (root / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[UNK]\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"configuration\.json: a ModelScope model descriptor, and no config"):
        resolve_checkpoint(root)


def test_the_nested_layout_flattens_as_paddlenlp_3_reads_it() -> None:
    base = {"hidden_size": 32, "num_hidden_layers": 2, "init_class": "ErnieModel"}
    nested = {"num_classes": 7, "init_args": [base], "init_class": "ErnieForSequenceClassification"}
    assert flatten_legacy_config(nested, Path("model_config.json")) == {
        "num_classes": 7,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "architectures": ["ErnieForSequenceClassification"],
    }
    by_keyword = {"ernie": base, "num_classes": 3, "hidden_size": 64, "init_class": "ErnieForSequenceClassification"}
    assert flatten_legacy_config(by_keyword, Path("m"))["hidden_size"] == 64  # the head's own keyword wins
    with pytest.raises(CheckpointError, match="init_args is dict"):
        flatten_legacy_config({"init_args": {}, "init_class": "X"}, Path("m"))


@pytest.mark.slow
@pytest.mark.integration
def test_paddlenlp_2x_checkpoints_release_through_every_gate(
    drill: Drill, tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path, tmp_path: Path
) -> None:
    nested = legacy_checkpoint(tiny_checkpoint_src, tmp_path / "nested", nested_layout)
    flat = legacy_checkpoint(tiny_checkpoint_b_src, tmp_path / "flat", flat_layout)
    for version, ckpt in enumerate((nested, flat), start=1):
        results = drill.release(ckpt)
        assert [r.step for r in results][-1] == "promote", results
        drill.assert_invariant(served=version)
        assert champion(drill.settings) == version
        info = json.loads((drill.repo / "seqcls_model" / str(version) / "release.json").read_text(encoding="utf-8"))
        assert info["fingerprint"] == resolve_checkpoint(ckpt).fingerprint, info
