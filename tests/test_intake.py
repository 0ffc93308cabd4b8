"""Content-addressed intake (#23 scenarios 6, 7, 11, 12): a release reads only its workspace snapshot.

At resolve the checkpoint's files are copied into ``<workspace>/checkpoint/`` while they are hashed;
every later step — in this process or in a later Airflow task — reads the snapshot, so a checkpoint
changed in place during a release has no effect on it. The unit tests use the minimal checkpoint
(no paddle); one slow test runs a real release up to publish.
"""

from __future__ import annotations

import errno
import hashlib
import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from seqcls import files
from seqcls.airflow.context import open_for_task
from seqcls.checkpoints import snapshot
from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.config import ReleaseConfig
from seqcls.errors import CheckpointError, ResourceError
from seqcls.release.intake import directory_fingerprint, open_release, resolve_checkpoint
from seqcls.release.records import serving_tokenizer
from seqcls.release.workspace import Workspace
from seqcls.settings import Settings
from tests.helpers.checkpoints import minimal_checkpoint

WEIGHTS = "model_state.pdparams"


@pytest.fixture
def settings(tmp_path: Path, home: Path) -> Settings:
    """Settings of this test's home, the checkpoints root being the test's directory."""
    return replace(Settings.from_env(), checkpoints_root=tmp_path)


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return minimal_checkpoint(tmp_path / "ckpt")


def _other_weights(ckpt: Path) -> None:
    """Replace the weights in place with another valid state dict (what a training job re-saving does)."""
    (ckpt / WEIGHTS).write_bytes(pickle.dumps({"w": [9.0] * 4}, protocol=2))


def _assert_reads_what_was_fingerprinted(release) -> None:
    ckpt = release.checkpoint
    for name, digest in ckpt.files.items():
        assert sha256_file(ckpt.path / name) == digest, name
    assert sha256_file(ckpt.weights) == ckpt.files[WEIGHTS]


# --- scenario 6: the weights replaced while a release runs


def test_the_weights_replaced_after_resolve_are_not_what_the_release_reads(ckpt: Path, settings: Settings) -> None:
    release = open_release(ckpt, settings=settings)
    original = sha256_file(ckpt / WEIGHTS)
    _other_weights(ckpt)
    assert release.checkpoint.files[WEIGHTS] == original
    _assert_reads_what_was_fingerprinted(release)
    assert release.checkpoint.source == ckpt.resolve()
    assert release.checkpoint.path == release.workspace.root / snapshot.SNAPSHOT_DIR


def test_weights_replaced_during_resolve_cannot_be_what_is_fingerprinted(
    ckpt: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pickle scan and the hash read the same bytes: the weights swapped right after the scan (on
    today's main, between the scan of the directory and its hashing) are neither scanned nor released."""
    from seqcls.checkpoints import checkpoint

    scanned = []
    real_scan = checkpoint.scan_pickle

    def scan_then_swap(path: Path, **kwargs) -> None:
        real_scan(path, **kwargs)
        scanned.append(sha256_file(path))
        _other_weights(ckpt)

    monkeypatch.setattr(checkpoint, "scan_pickle", scan_then_swap)
    release = open_release(ckpt, settings=settings)
    assert release.checkpoint.files[WEIGHTS] == scanned[0]
    _assert_reads_what_was_fingerprinted(release)


def test_a_later_task_opens_the_runs_snapshot_after_the_checkpoint_changed(ckpt: Path, settings: Settings) -> None:
    release = open_release(ckpt, settings=settings)
    fp = release.checkpoint.fingerprint
    _other_weights(ckpt)
    (ckpt / "vocab.txt").unlink()  # even a checkpoint that would no longer resolve
    task = open_for_task(str(ckpt), {}, settings, fingerprint=fp)
    assert task.checkpoint.fingerprint == fp and task.workspace.root == release.workspace.root
    assert task.checkpoint.source == ckpt.resolve()
    _assert_reads_what_was_fingerprinted(task)
    # under `airflow tasks test` (no fingerprint) the checkpoint param is resolved as it is now
    with pytest.raises(CheckpointError, match=r"ckpt/vocab\.txt: missing"):
        open_for_task(str(ckpt), {}, settings)


def test_the_same_checkpoint_reopened_verifies_the_snapshot_instead_of_recopying(
    ckpt: Path, settings: Settings
) -> None:
    first = open_release(ckpt, settings=settings)
    weights = first.checkpoint.weights
    before = weights.stat().st_ino
    again = open_release(ckpt, settings=settings)
    assert again.checkpoint.weights == weights and weights.stat().st_ino == before  # kept, not copied again
    assert again.checkpoint.fingerprint == first.checkpoint.fingerprint == directory_fingerprint(ckpt)
    assert again.checkpoint.fingerprint == resolve_checkpoint(ckpt).fingerprint  # today's formula
    moved = shutil.copytree(ckpt, ckpt.parent / "same-bytes-elsewhere")
    other = open_release(moved, settings=settings)  # same workspace, kept; the record names the latest source
    assert other.checkpoint.weights.stat().st_ino == before
    assert snapshot.read_record(other.checkpoint.path).source == str(moved.resolve()) == str(other.checkpoint.source)


def test_a_damaged_snapshot_is_remade_from_an_unchanged_checkpoint_or_refused_naming_the_file(
    ckpt: Path, settings: Settings
) -> None:
    release = open_release(ckpt, settings=settings)
    fp = release.checkpoint.fingerprint
    release.checkpoint.weights.write_bytes(b"damaged")
    task = open_for_task(str(ckpt), {}, settings, fingerprint=fp)  # the checkpoint still hashes to fp
    _assert_reads_what_was_fingerprinted(task)
    task.checkpoint.weights.write_bytes(b"damaged")
    _other_weights(ckpt)
    with pytest.raises(CheckpointError, match=rf"checkpoint/{WEIGHTS}: .*damaged.*{ckpt.resolve()}.*changed"):
        open_for_task(str(ckpt), {}, settings, fingerprint=fp)
    (task.checkpoint.path / "added_tokens.json").write_text("{}", encoding="utf-8")  # a file slipped in
    with pytest.raises(CheckpointError, match=r"added_tokens\.json: .*not part of"):
        snapshot.verify(task.checkpoint.path)


def test_a_workspace_without_a_snapshot_is_taken_in_again_from_the_runs_checkpoint(
    ckpt: Path, settings: Settings
) -> None:
    """A workspace opened before snapshots existed (or its snapshot removed): a later task takes the
    checkpoint the run names in again — only while it still hashes to the run's fingerprint."""
    release = open_release(ckpt, settings=settings)
    fp = release.checkpoint.fingerprint
    shutil.rmtree(release.checkpoint.path)
    task = open_for_task(str(ckpt), {}, settings, fingerprint=fp)
    _assert_reads_what_was_fingerprinted(task)
    assert task.checkpoint.path == release.checkpoint.path
    shutil.rmtree(task.checkpoint.path)
    _other_weights(ckpt)
    with pytest.raises(CheckpointError, match=r"\.seqcls-snapshot\.json: missing.*no longer hashes"):
        open_for_task(str(ckpt), {}, settings, fingerprint=fp)


# --- scenario 7: a file replaced by a link leaving the checkpoint after resolve


def test_a_file_linked_out_after_resolve_is_not_what_the_release_serves(
    ckpt: Path, settings: Settings, tmp_path: Path
) -> None:
    release = open_release(ckpt, settings=settings)
    original = (ckpt / "vocab.txt").read_bytes()
    outside = tmp_path / "outside-vocab.txt"
    outside.write_bytes(original.replace("育".encode(), "外".encode()))
    (ckpt / "vocab.txt").unlink()
    (ckpt / "vocab.txt").symlink_to(outside)
    tokenizer = serving_tokenizer(release)  # what publish copies into the tokenizer's version
    assert tokenizer.file.is_relative_to(release.workspace.root) and not tokenizer.file.is_symlink()
    assert tokenizer.file.read_bytes() == original
    _assert_reads_what_was_fingerprinted(release)


def test_the_snapshot_holds_plain_files_and_links_leaving_the_checkpoint_stay_refused(
    ckpt: Path, settings: Settings, tmp_path: Path
) -> None:
    (ckpt / "labels").mkdir()
    shutil.move(ckpt / "label.txt", ckpt / "labels" / "v1.txt")
    (ckpt / "label.txt").symlink_to(Path("labels") / "v1.txt")  # inside: followed
    release = open_release(ckpt, settings=settings)
    snap = release.checkpoint.path
    assert all(p.is_file() and not p.is_symlink() for p in snap.iterdir())
    assert (snap / "label.txt").read_bytes() == (ckpt / "labels" / "v1.txt").read_bytes()
    outside = tmp_path / "outside.txt"
    shutil.copy(ckpt / "vocab.txt", outside)
    (ckpt / "vocab.txt").unlink()
    (ckpt / "vocab.txt").symlink_to(outside)
    with pytest.raises(CheckpointError, match=r"ckpt/vocab\.txt: is a symlink to .*outside the checkpoint"):
        open_release(ckpt, settings=settings)


def test_the_snapshot_keeps_only_what_the_release_reads(ckpt: Path, settings: Settings) -> None:
    (ckpt / "tokenizer.json").write_text("{}", encoding="utf-8")  # a transformers file in a PaddleNLP checkpoint
    (ckpt / "pytorch_model.bin").write_bytes(b"not read by PaddleNLP")
    release = open_release(ckpt, settings=settings)
    kept = {p.name for p in release.checkpoint.path.iterdir() if p.name != snapshot.RECORD}
    assert kept == set(release.checkpoint.files)
    assert snapshot.verify(release.checkpoint.path).files == release.checkpoint.files


def test_errors_name_the_operators_files_and_leave_no_workspace(ckpt: Path, settings: Settings) -> None:
    (ckpt / "label.txt").write_text("a\nb\nc\n", encoding="utf-8")
    with pytest.raises(CheckpointError) as err:
        open_release(ckpt, settings=settings)
    assert str(err.value).startswith(f"{ckpt.resolve() / 'label.txt'}: 3 labels")
    assert "checkpoint/" not in str(err.value) and ".intake" not in str(err.value)
    model_dir = settings.releases_dir / ReleaseConfig().model_name
    assert not model_dir.exists() or not [p for p in model_dir.rglob("*") if p.is_file()]


def test_an_explicit_label_and_golden_file_are_taken_in_under_their_names(
    ckpt: Path, settings: Settings, tmp_path: Path
) -> None:
    labels, golden = tmp_path / "my-labels.txt", tmp_path / "my-golden.txt"
    shutil.copy(ckpt / "label.txt", labels)
    golden.write_text("体育新闻\n", encoding="utf-8")
    release = open_release(ckpt, settings=settings, label_file=labels, golden_file=golden)
    snap = release.checkpoint.path
    assert release.checkpoint.label_file == snap / "label.txt"
    assert (snap / "golden.txt").read_text(encoding="utf-8") == "体育新闻\n"
    assert release.checkpoint.golden_texts == ("体育新闻",)
    golden.write_text("另一条\n", encoding="utf-8")  # changed between runs: the next resolve takes it in
    again = open_release(ckpt, settings=settings, label_file=labels, golden_file=golden)
    assert (
        again.checkpoint.golden_texts == ("另一条",) and again.checkpoint.fingerprint == release.checkpoint.fingerprint
    )


# --- scenario 12: a golden text too long to serve


def test_a_golden_text_longer_than_the_server_accepts_is_refused_at_resolve(ckpt: Path, settings: Settings) -> None:
    (ckpt / "golden.txt").write_text("第一条\n第二条\n" + "长" * (5 << 20) + "\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"ckpt/golden\.txt: line 3 is 15728640 bytes.* 65536"):
        open_release(ckpt, settings=settings)
    with pytest.raises(CheckpointError, match=r"golden\.txt: line 3"):
        resolve_checkpoint(ckpt)


# --- scenario 11 (workspace half): a full disk is a seqcls error naming the path and the free space


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_in_a_step_is_a_resource_error_and_the_failure_is_recorded(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(ResourceError, match=rf"{tmp_path / 'ws'}.*No space left on device.*MB free there"):
        ws.run_step("export", {"x": 1}, _enospc, out_dir="static")
    rec = ws.step("export")
    assert rec["status"] == "failed" and rec["error"].startswith("ResourceError:")


def test_a_full_disk_while_taking_the_snapshot_is_a_resource_error(
    ckpt: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = open

    class Full:
        """A file being written on a full disk."""

        def __init__(self, fh) -> None:
            self.fh = fh

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc) -> None:
            self.fh.close()

        write = staticmethod(_enospc)

    def full(path, mode="r", *args, **kwargs):
        fh = real_open(path, mode, *args, **kwargs)
        return Full(fh) if "w" in mode or "x" in mode else fh

    monkeypatch.setattr(files, "open", full, raising=False)  # where the snapshot's copies are written
    with pytest.raises(ResourceError, match=r"releases/.*No space left on device.*MB free there"):
        open_release(ckpt, settings=settings)


# --- the fingerprint stays what it was


def test_the_fingerprint_formula_is_unchanged(ckpt: Path, settings: Settings) -> None:
    names = ("config.json", "vocab.txt", "tokenizer_config.json", "label.txt", WEIGHTS)
    files = {name: hashlib.sha256((ckpt / name).read_bytes()).hexdigest() for name in names}
    expected = hashlib.sha256("\n".join(f"{k}={v}" for k, v in sorted(files.items())).encode()).hexdigest()
    assert open_release(ckpt, settings=settings).checkpoint.fingerprint == expected


# --- a real release up to publish (paddle)


def _array_digests(weights: Path) -> set[str]:
    import numpy as np

    state = pickle.loads(weights.read_bytes())
    return {
        hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
        for v in state.values()
        if isinstance(v, np.ndarray) and v.size > 64
    }


def _onnx_digests(onnx_path: Path) -> set[str]:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))
    return {
        hashlib.sha256(np.ascontiguousarray(numpy_helper.to_array(t)).tobytes()).hexdigest()
        for t in model.graph.initializer
    }


@pytest.mark.slow
def test_a_checkpoint_changed_in_place_during_a_release_has_no_effect_on_what_is_published(
    tiny_checkpoint: Path, tiny_checkpoint_b_src: Path, home: Path, tmp_path: Path
) -> None:
    from seqcls.steps import run_release, step

    settings = replace(Settings.from_env(), checkpoints_root=tmp_path)
    release = open_release(tiny_checkpoint, settings=settings)
    genuine_weights = _array_digests(tiny_checkpoint / WEIGHTS)
    genuine_vocab = (tiny_checkpoint / "vocab.txt").read_bytes()
    # scenario 6: other (valid) weights; scenario 7: vocab.txt a link to a file outside the checkpoint
    shutil.copyfile(tiny_checkpoint_b_src / WEIGHTS, tiny_checkpoint / WEIGHTS)
    outside = tmp_path / "outside-vocab.txt"
    vocab = genuine_vocab.decode().splitlines()
    outside.write_text("\n".join([*vocab[:-1], "外来词"]) + "\n", encoding="utf-8")
    (tiny_checkpoint / "vocab.txt").unlink()
    (tiny_checkpoint / "vocab.txt").symlink_to(outside)

    run_release(release, until="evaluate")
    published = step("publish")(release)
    repo = Path(published.summary["repository"])
    vocabs = list(repo.rglob(f"{published.summary['version']}/vocab.txt"))
    assert vocabs and all(v.read_bytes() == genuine_vocab for v in vocabs)
    onnx_files = list(repo.rglob(f"{published.summary['version']}/model.onnx"))
    assert onnx_files
    served, others = _onnx_digests(onnx_files[0]), _array_digests(tiny_checkpoint_b_src / WEIGHTS)
    assert (genuine_weights - others) & served, "the served graph does not hold the fingerprinted weights"
    assert not (others - genuine_weights) & served, "the served graph holds the weights swapped in after resolve"
    # a later task of this run (another process in Airflow) opens the same snapshot
    task = open_for_task(str(tiny_checkpoint), {}, settings, fingerprint=release.checkpoint.fingerprint)
    assert task.workspace.root == release.workspace.root
    _assert_reads_what_was_fingerprinted(task)
