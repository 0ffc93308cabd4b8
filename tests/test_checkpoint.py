"""Checkpoint validation: every bad input is a CheckpointError naming the file and the problem."""

from __future__ import annotations

import json
import os
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from seqcls.errors import CheckpointError
from seqcls.release.completion import find_latest, mark_complete, read_marker
from seqcls.release.intake import directory_fingerprint, resolve_checkpoint

pytestmark = pytest.mark.slow  # the session fixture builds a real (tiny) paddle checkpoint


def test_valid_checkpoint(tiny_checkpoint: Path) -> None:
    ckpt = resolve_checkpoint(tiny_checkpoint)
    assert ckpt.num_labels == len(ckpt.labels) == 7
    assert ckpt.labels[1] == "组织关系##裁员"
    assert ckpt.weights.name == "model_state.pdparams"
    assert len(ckpt.fingerprint) == 64
    assert ckpt.golden_texts is None
    assert set(ckpt.files) >= {"config.json", "vocab.txt", "label.txt", "model_state.pdparams"}


def test_fingerprint_follows_model_files_not_golden(tiny_checkpoint: Path) -> None:
    fp = resolve_checkpoint(tiny_checkpoint).fingerprint
    (tiny_checkpoint / "golden.txt").write_text("一条测试文本\n", encoding="utf-8")
    with_golden = resolve_checkpoint(tiny_checkpoint)
    assert with_golden.fingerprint == fp and with_golden.golden_texts == ("一条测试文本",)
    vocab = (tiny_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[-1] = "新词"
    (tiny_checkpoint / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    assert resolve_checkpoint(tiny_checkpoint).fingerprint != fp


def test_missing_vocab(tiny_checkpoint: Path) -> None:
    (tiny_checkpoint / "vocab.txt").unlink()
    with pytest.raises(CheckpointError, match=r"vocab\.txt: missing"):
        resolve_checkpoint(tiny_checkpoint)


def test_missing_weights(tiny_checkpoint: Path) -> None:
    (tiny_checkpoint / "model_state.pdparams").unlink()
    with pytest.raises(CheckpointError, match="no weights"):
        resolve_checkpoint(tiny_checkpoint)


def test_truncated_params(tiny_checkpoint: Path) -> None:
    p = tiny_checkpoint / "model_state.pdparams"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"model_state\.pdparams: truncated or corrupt"):
        resolve_checkpoint(tiny_checkpoint)


def test_empty_params(tiny_checkpoint: Path) -> None:
    (tiny_checkpoint / "model_state.pdparams").write_bytes(b"")
    with pytest.raises(CheckpointError, match="weight file is empty"):
        resolve_checkpoint(tiny_checkpoint)


def test_truncated_safetensors(tiny_checkpoint: Path) -> None:
    (tiny_checkpoint / "model_state.pdparams").unlink()
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    blob = len(header).to_bytes(8, "little") + header + b"\0" * 8  # 8 of 16 bytes
    (tiny_checkpoint / "model.safetensors").write_bytes(blob)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated or corrupt"):
        resolve_checkpoint(tiny_checkpoint)


def test_label_count_mismatch(tiny_checkpoint: Path) -> None:
    (tiny_checkpoint / "label.txt").write_text("a\nb\nc\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"label\.txt: 3 labels but config\.json says the model has 7"):
        resolve_checkpoint(tiny_checkpoint)


def test_empty_label_file(tiny_checkpoint: Path) -> None:
    (tiny_checkpoint / "label.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"label\.txt: label file is empty"):
        resolve_checkpoint(tiny_checkpoint)


def test_duplicate_and_blank_labels(tiny_checkpoint: Path) -> None:
    (tiny_checkpoint / "label.txt").write_text("a\na\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="appears twice"):
        resolve_checkpoint(tiny_checkpoint)
    (tiny_checkpoint / "label.txt").write_text("a\n\nb\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="line 2 is blank"):
        resolve_checkpoint(tiny_checkpoint)


def test_unreadable_file(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root in CI, where chmod 000 does not stop reads: simulate the OS refusing.
    real = Path.read_text

    def deny(self: Path, *a, **kw):
        if self.name == "tokenizer_config.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", deny)
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: not readable \(Permission denied\)"):
        resolve_checkpoint(tiny_checkpoint)


def test_not_utf8_and_bad_json(tiny_checkpoint: Path) -> None:
    (tiny_checkpoint / "label.txt").write_bytes(b"\xff\xfe bad")
    with pytest.raises(CheckpointError, match=r"label\.txt: not UTF-8"):
        resolve_checkpoint(tiny_checkpoint)
    (tiny_checkpoint / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"config\.json: invalid JSON"):
        resolve_checkpoint(tiny_checkpoint)


def test_vocab_larger_than_embedding(tiny_checkpoint: Path) -> None:
    cfg = json.loads((tiny_checkpoint / "config.json").read_text())
    cfg["vocab_size"] = 10
    (tiny_checkpoint / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="vocab_size is 10"):
        resolve_checkpoint(tiny_checkpoint)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nope")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(CheckpointError, match="is not a directory"):
        resolve_checkpoint(f)


def test_tiny_checkpoints_are_marked_complete_and_latest_follows_the_marker(
    tiny_checkpoint: Path, tiny_checkpoint_b: Path, tmp_path: Path
) -> None:
    # build_tiny_checkpoint writes the completion marker last, as a training job does
    done = read_marker(tiny_checkpoint)
    assert done is not None and done.fingerprint == resolve_checkpoint(tiny_checkpoint).fingerprint
    root = tmp_path / "root"
    newer = shutil.copytree(tiny_checkpoint, root / "a")
    older = shutil.copytree(tiny_checkpoint_b, root / "b")  # the greater name, the newer files
    mark_complete(older, completed_at=done.completed_at - timedelta(days=1))
    for f in newer.iterdir():
        os.utime(f, (1, 1))
    assert find_latest(root) == newer  # the newer marker wins although its files are older


def test_bom_and_crlf_text_files_give_clean_names(tiny_checkpoint: Path) -> None:
    bom = "\ufeff".encode()
    labels = (tiny_checkpoint / "label.txt").read_text(encoding="utf-8").splitlines()
    (tiny_checkpoint / "label.txt").write_bytes(bom + "\r\n".join(labels).encode() + b"\r\n")
    (tiny_checkpoint / "golden.txt").write_bytes(bom + "一条测试文本\r\n第二条\r\n\r\n".encode())
    vocab = (tiny_checkpoint / "vocab.txt").read_bytes()
    (tiny_checkpoint / "vocab.txt").write_bytes(vocab.replace(b"\n", b"\r\n"))  # CRLF: PaddleNLP drops it too
    ckpt = resolve_checkpoint(tiny_checkpoint)
    assert ckpt.labels == tuple(labels) and ckpt.labels[0] == "组织关系"
    assert ckpt.golden_texts == ("一条测试文本", "第二条")
    assert not any("\ufeff" in t or "\r" in t for t in (*ckpt.labels, *ckpt.golden_texts))
    assert ckpt.vocab_size == len(vocab.decode().splitlines())
    # an explicitly given label file is read the same way
    other = tiny_checkpoint.parent / "labels-crlf.txt"
    other.write_bytes(bom + "\r\n".join(labels).encode())
    assert resolve_checkpoint(tiny_checkpoint, label_file=other).labels == tuple(labels)


def test_a_bom_where_paddlenlp_would_keep_it_is_refused(tiny_checkpoint: Path) -> None:
    vocab = tiny_checkpoint / "vocab.txt"
    vocab.write_bytes("\ufeff".encode() + vocab.read_bytes())
    with pytest.raises(CheckpointError, match=r"vocab\.txt: starts with a UTF-8 byte-order mark.*'\\ufeff\[PAD\]'"):
        resolve_checkpoint(tiny_checkpoint)
    vocab.write_bytes(vocab.read_bytes()[3:])
    config = tiny_checkpoint / "config.json"
    config.write_bytes("\ufeff".encode() + config.read_bytes())
    with pytest.raises(CheckpointError, match=r"config\.json: starts with a UTF-8 byte-order mark"):
        resolve_checkpoint(tiny_checkpoint)


@pytest.mark.parametrize("name", ["label.txt", "golden.txt", "vocab.txt", "config.json", "model_state.pdparams"])
def test_a_file_linked_from_outside_the_checkpoint_is_refused(tiny_checkpoint: Path, tmp_path: Path, name: str) -> None:
    outside = tmp_path / "outside" / name
    outside.parent.mkdir()
    link = tiny_checkpoint / name
    if link.exists():
        shutil.move(link, outside)
    else:
        outside.write_text("一条测试文本\n", encoding="utf-8")
    link.symlink_to(outside)
    with pytest.raises(CheckpointError, match=rf"ckpt/{re.escape(name)}: is a symlink to .*outside the checkpoint"):
        resolve_checkpoint(tiny_checkpoint)
    with pytest.raises(CheckpointError, match=rf"ckpt/{re.escape(name)}: is a symlink"):
        directory_fingerprint(tiny_checkpoint)


def test_links_inside_the_checkpoint_and_a_linked_checkpoint_are_allowed(tiny_checkpoint: Path, tmp_path: Path) -> None:
    fp = resolve_checkpoint(tiny_checkpoint).fingerprint
    (tiny_checkpoint / "labels").mkdir()
    shutil.move(tiny_checkpoint / "label.txt", tiny_checkpoint / "labels" / "v1.txt")
    (tiny_checkpoint / "label.txt").symlink_to(Path("labels") / "v1.txt")  # relative, inside
    linked = tmp_path / "current"
    linked.symlink_to(tiny_checkpoint, target_is_directory=True)  # the directory itself may be a link
    ckpt = resolve_checkpoint(linked)
    assert ckpt.path == tiny_checkpoint.resolve() and ckpt.fingerprint == fp == directory_fingerprint(linked)
    assert ckpt.labels[1] == "组织关系##裁员"
    # a label file given explicitly is the caller's choice, wherever it is
    (tiny_checkpoint / "label.txt").unlink()
    (tiny_checkpoint / "label.txt").symlink_to(tmp_path / "nowhere.txt")
    assert resolve_checkpoint(linked, label_file=tiny_checkpoint / "labels" / "v1.txt").labels == ckpt.labels
