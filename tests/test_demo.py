"""The demo dataset (versioned, hierarchical, reproducible) and the demo trainer's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seqcls_tools.demo import DATA_DIR, HIERARCHY, LABELS, SPLITS, load_split
from seqcls_tools.demo.make_dataset import write_dataset
from seqcls_tools.demo.train import f1_scores, select_golden
from tests.helpers.demo_models import quick_demo_model


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return {name: load_split(name) for name in SPLITS}


def _branches(labels: list[str]) -> set[str]:
    return {label.split("##")[0] for label in labels}


def test_sizes(splits: dict[str, list[dict]]) -> None:
    assert sum(len(rows) for rows in splits.values()) >= 1200
    assert len(splits["train"]) >= 1000
    assert len(splits["dev"]) >= 100 and len(splits["test"]) >= 200
    assert sum(p.stat().st_size for p in DATA_DIR.glob("*.jsonl")) < 1_000_000


def test_label_set_is_a_two_level_hierarchy() -> None:
    leaves = [label for label in LABELS if "##" in label]
    assert len(leaves) >= 10
    assert len(LABELS) == len(set(LABELS))
    assert [label for label in LABELS if "##" not in label] == list(HIERARCHY)
    for leaf in leaves:
        parent, child = leaf.split("##")
        assert child and "##" not in child
        assert LABELS.index(parent) < LABELS.index(leaf)  # label.txt lists the parent first


def test_rows_are_hierarchy_consistent(splits: dict[str, list[dict]]) -> None:
    for rows in splits.values():
        for row in rows:
            labels = row["labels"]
            assert set(row) == {"text", "labels"} and row["text"].strip()
            assert labels and set(labels) <= set(LABELS)
            assert labels == [label for label in LABELS if label in labels]  # unique, label.txt order
            for label in labels:
                if "##" in label:
                    assert label.split("##")[0] in labels, (row, "child without parent")
                else:
                    assert any(lb.startswith(label + "##") for lb in labels), (row, "parent without child")


def test_every_label_is_used_in_every_split(splits: dict[str, list[dict]]) -> None:
    for name, rows in splits.items():
        used = {label for row in rows for label in row["labels"]}
        assert used == set(LABELS), (name, set(LABELS) - used)


def test_a_noticeable_share_spans_two_branches(splits: dict[str, list[dict]]) -> None:
    rows = [row for rows in splits.values() for row in rows]
    share = sum(len(_branches(row["labels"])) > 1 for row in rows) / len(rows)
    assert 0.15 <= share <= 0.25
    assert any(row["text"].isascii() for row in rows)  # some English ...
    assert any(not row["text"].isascii() and any(c.isascii() and c.isalpha() for c in row["text"]) for row in rows)


def test_splits_are_disjoint_and_texts_unique(splits: dict[str, list[dict]]) -> None:
    texts = [row["text"] for rows in splits.values() for row in rows]
    assert len(texts) == len(set(texts))


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    paths = write_dataset(tmp_path)
    assert set(paths) == set(SPLITS)
    for name, path in paths.items():
        assert path.read_bytes() == (DATA_DIR / f"{name}.jsonl").read_bytes(), name


def test_load_split_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown split"):
        load_split("validation")


def test_f1_scores() -> None:
    gold = np.array([[1, 0, 1], [0, 1, 0]], dtype="float32")
    assert f1_scores(gold, gold) == (1.0, 1.0)
    pred = np.array([[1, 0, 0], [0, 1, 1]], dtype="float32")  # tp=2, fp=1, fn=1
    micro, macro = f1_scores(gold, pred)
    assert micro == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert macro == pytest.approx((1.0 + 1.0 + 0.0) / 3)


def test_select_golden_prefers_correct_confident_texts() -> None:
    labels = ["A", "A##x", "B", "B##y"]
    gold = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]], dtype="float32")
    probs = np.array(
        [
            [0.99, 0.97, 0.01, 0.02],  # correct, confident
            [0.99, 0.55, 0.01, 0.02],  # correct, but 0.55 is too close to 0.5
            [0.02, 0.01, 0.98, 0.96],  # correct, confident
            [0.97, 0.95, 0.10, 0.03],  # confident but wrong (misses B)
        ]
    )
    chosen = select_golden(["t0", "t1", "t2", "t3"], gold, probs, labels, limit=3)
    assert chosen[:2] == [0, 2]
    assert 1 not in chosen[:2] and 3 not in chosen[:2]


@pytest.mark.slow
def test_quick_training_writes_a_reloadable_checkpoint(
    tmp_path_factory: pytest.TempPathFactory, splits: dict[str, list[dict]]
) -> None:
    paddle = pytest.importorskip("paddle")
    from paddlenlp.transformers import AutoModelForSequenceClassification, AutoTokenizer

    result = quick_demo_model(tmp_path_factory)  # trained here or by another module of this session
    out = result.path

    assert out.is_dir()
    assert result.n_train == len(splits["train"]) and result.n_test == len(splits["test"])
    assert 0.0 <= result.micro_f1 <= 1.0 and 0.0 <= result.macro_f1 <= 1.0
    assert result.epochs >= 1 and result.seconds > 0 and len(result.example_predictions) == 5
    for name in ("config.json", "model_state.pdparams", "vocab.txt", "tokenizer_config.json", "metrics.json"):
        assert (out / name).is_file(), name
    assert (out / "label.txt").read_text(encoding="utf-8").splitlines() == LABELS
    golden = (out / "golden.txt").read_text(encoding="utf-8").splitlines()
    assert golden and set(golden) <= {row["text"] for row in splits["test"]}
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["seed"] == 0 and metrics["epochs"] == result.epochs
    assert metrics["micro_f1"] == result.micro_f1 and metrics["macro_f1"] == result.macro_f1
    assert [g["text"] for g in metrics["golden"]] == golden

    # The saved checkpoint, reloaded the way the release pipeline does, reproduces the recorded logits.
    model = AutoModelForSequenceClassification.from_pretrained(str(out))
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert model.config.num_labels == len(LABELS)
    with paddle.no_grad():
        for record in metrics["golden"]:
            enc = tokenizer(record["text"], max_length=128, truncation=True)
            ids = paddle.to_tensor([enc["input_ids"]])
            logits = model(input_ids=ids, token_type_ids=paddle.to_tensor([enc["token_type_ids"]])).numpy()[0]
            np.testing.assert_allclose(logits, record["logits"], atol=1e-4, rtol=1e-4)
