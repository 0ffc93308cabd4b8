"""``latest`` is the checkpoint its training job marked complete last — by the marker's content, not mtimes.

Fast: the checkpoints here are minimal but valid (a pickle of plain numbers as weights), so no
paddle is imported; ``tests/test_checkpoint.py`` checks that the real tiny checkpoints are marked.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from seqcls.errors import CheckpointError, InputError
from seqcls.release.completion import MARKER_FILE, find_latest, mark_complete, read_marker
from seqcls.release.intake import directory_fingerprint, resolve_checkpoint
from tests.helpers.checkpoints import minimal_checkpoint

T0 = datetime(2025, 1, 31, 12, 0, tzinfo=UTC)


def _cp_r(src: Path, dst: Path) -> Path:
    """What ``cp -r`` does: the same bytes (the marker included), every file with a fresh mtime."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    now = datetime.now().timestamp() + 3600
    for f in dst.iterdir():
        os.utime(f, (now, now))
    return dst


def _age(path: Path) -> None:
    for f in path.iterdir():
        os.utime(f, (1, 1))


def test_mark_complete_writes_the_schema_atomically(tmp_path: Path) -> None:
    ckpt = minimal_checkpoint(tmp_path / "run-1")
    done = mark_complete(ckpt, run="train-42", completed_at=T0)
    data = json.loads((ckpt / MARKER_FILE).read_text(encoding="utf-8"))
    assert data == {
        "completed_at": "2025-01-31T12:00:00.000000Z",
        "fingerprint": resolve_checkpoint(ckpt).fingerprint,
        "run": "train-42",
    }
    assert data["fingerprint"] == directory_fingerprint(ckpt) == done.fingerprint
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith(MARKER_FILE)) == [MARKER_FILE]  # no temp left
    assert read_marker(ckpt) == done
    assert read_marker(minimal_checkpoint(tmp_path / "run-2")) is None
    default = mark_complete(ckpt)  # now, in UTC; run optional
    assert default.completed_at.tzinfo is not None and default.completed_at > T0 and default.run is None
    assert json.loads((ckpt / MARKER_FILE).read_text())["completed_at"].endswith("Z")


def test_mark_complete_refuses_what_cannot_be_released(tmp_path: Path) -> None:
    ckpt = minimal_checkpoint(tmp_path / "run-1")
    (ckpt / "vocab.txt").unlink()
    with pytest.raises(CheckpointError, match=r"vocab\.txt: missing"):
        mark_complete(ckpt)
    assert not (ckpt / MARKER_FILE).exists()
    with pytest.raises(InputError, match="no timezone"):
        mark_complete(minimal_checkpoint(tmp_path / "run-2"), completed_at=datetime(2025, 1, 1))


def test_a_cp_r_of_an_older_checkpoint_does_not_become_latest(tmp_path: Path) -> None:
    root = tmp_path / "root"
    old = minimal_checkpoint(root / "a-old", seed=1)
    new = minimal_checkpoint(root / "b-new", seed=2)
    mark_complete(old, completed_at=T0)
    mark_complete(new, completed_at=T0 + timedelta(days=1))
    _age(new)
    copy = _cp_r(old, root / "c-copy-of-old")  # newest files, greatest name, the old marker
    newest_file = {d.name: max(f.stat().st_mtime for f in d.iterdir()) for d in (old, new, copy)}
    assert max(newest_file, key=newest_file.get) == copy.name  # what mtime-based `latest` used to pick
    assert (copy / MARKER_FILE).read_bytes() == (old / MARKER_FILE).read_bytes()
    assert find_latest(root) == new


def test_a_directory_without_a_marker_is_skipped_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "root"
    done = minimal_checkpoint(root / "run-1")
    mark_complete(done, completed_at=T0)
    _age(done)
    minimal_checkpoint(root / "run-2-still-writing", seed=3)  # newest files, no marker
    with caplog.at_level(logging.INFO, logger="seqcls.release.completion"):
        assert find_latest(root) == done
    assert f"skipped 1 of 2 directories under {root} without {MARKER_FILE}" in caplog.text
    assert "run-2-still-writing" in caplog.text


def test_the_marker_written_later_wins_and_ties_go_to_the_greatest_name(tmp_path: Path) -> None:
    root = tmp_path / "root"
    a = minimal_checkpoint(root / "a", seed=1)
    b = minimal_checkpoint(root / "b", seed=2)
    mark_complete(a, completed_at=T0 + timedelta(hours=2))
    mark_complete(b, completed_at=T0 + timedelta(hours=1))
    assert find_latest(root) == a
    mark_complete(b, completed_at=T0 + timedelta(hours=3))  # marked again: now the newest
    assert find_latest(root) == b
    # other offsets compare as instants: 14:00+02:00 is 12:00Z, earlier than a's 14:00Z
    (b / MARKER_FILE).write_text(json.dumps({"completed_at": "2025-01-31T14:00:00+02:00"}), encoding="utf-8")
    assert find_latest(root) == a
    mark_complete(b, completed_at=T0 + timedelta(hours=2))
    assert find_latest(root) == b  # same instant: the greatest name


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", r"SEQCLS_DONE\.json: invalid JSON"),
        ("[]", r"SEQCLS_DONE\.json: expected a JSON object"),
        ("{}", r"SEQCLS_DONE\.json: field 'completed_at' is missing; the training job writes"),
        ('{"completed_at": "yesterday"}', r"SEQCLS_DONE\.json: field 'completed_at' is 'yesterday', not an ISO-8601"),
        ('{"completed_at": 1738324800}', r"SEQCLS_DONE\.json: field 'completed_at' is 1738324800, not an ISO-8601"),
        ('{"completed_at": "2025-01-31T12:00:00"}', r"SEQCLS_DONE\.json: field 'completed_at' .* with a UTC offset"),
        ('{"completed_at": "2025-01-31T12:00:00Z", "fingerprint": "abc"}', r"field 'fingerprint' is 'abc'"),
        ('{"completed_at": "2025-01-31T12:00:00Z", "run": 7}', r"SEQCLS_DONE\.json: field 'run' is 7"),
    ],
)
def test_a_malformed_marker_names_the_file_and_the_field(tmp_path: Path, content: str, match: str) -> None:
    root = tmp_path / "root"
    mark_complete(minimal_checkpoint(root / "z-good"), completed_at=T0)
    bad = minimal_checkpoint(root / "a-bad", seed=1)
    (bad / MARKER_FILE).write_text(content, encoding="utf-8")
    with pytest.raises(CheckpointError, match=match) as err:
        find_latest(root)  # an error even though it would not be the newest: never silently skipped
    assert str(bad / MARKER_FILE) in str(err.value)


def test_a_marker_whose_fingerprint_does_not_match_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ckpt = minimal_checkpoint(root / "run-1")
    mark_complete(ckpt, completed_at=T0)
    (ckpt / "label.txt").write_text("体育\n体育##加盟\n", encoding="utf-8")  # edited after training
    with pytest.raises(CheckpointError, match=r"run-1/SEQCLS_DONE\.json: records fingerprint [0-9a-f]{16} but"):
        find_latest(root)
    mark_complete(ckpt, completed_at=T0)  # the change was intended: marked again
    assert find_latest(root) == ckpt
    # a marker copied from another checkpoint into one its training job never marked
    other = minimal_checkpoint(root / "run-2", seed=5)
    shutil.copyfile(ckpt / MARKER_FILE, other / MARKER_FILE)
    with pytest.raises(CheckpointError, match=r"run-2/SEQCLS_DONE\.json: records fingerprint .* changed after"):
        find_latest(root)


def test_a_marker_without_fingerprint_or_run_is_enough(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ckpt = minimal_checkpoint(root / "run-1")
    (ckpt / MARKER_FILE).write_text('{"completed_at": "2025-01-31T12:00:00Z"}\n', encoding="utf-8")
    assert find_latest(root) == ckpt
    assert read_marker(ckpt).fingerprint is None


def test_no_marker_anywhere_says_how_to_write_one(tmp_path: Path) -> None:
    root = tmp_path / "root"
    minimal_checkpoint(root / "run-1")
    with pytest.raises(CheckpointError, match=r"no completed checkpoint found — none of its 1 directories holds") as e:
        find_latest(root)
    assert "mark_complete(" in str(e.value) and MARKER_FILE in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no completed checkpoint found"):
        find_latest(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="checkpoints root does not exist"):
        find_latest(tmp_path / "missing")


def test_the_root_itself_and_symlinked_checkpoints(tmp_path: Path) -> None:
    ckpt = minimal_checkpoint(tmp_path / "elsewhere" / "run-1")
    mark_complete(ckpt, completed_at=T0)
    assert find_latest(ckpt) == ckpt  # SEQCLS_CHECKPOINTS_ROOT pointing at one checkpoint
    root = tmp_path / "root"
    root.mkdir()
    (root / "run-1").symlink_to(ckpt, target_is_directory=True)  # the directory may be a link
    assert find_latest(root) == root / "run-1"


def test_a_marker_linked_from_outside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ckpt = minimal_checkpoint(root / "run-1")
    outside = tmp_path / "marker.json"
    outside.write_text('{"completed_at": "2025-01-31T12:00:00Z"}', encoding="utf-8")
    (ckpt / MARKER_FILE).symlink_to(outside)
    with pytest.raises(CheckpointError, match=r"run-1/SEQCLS_DONE\.json: is a symlink to .* outside the checkpoint"):
        find_latest(root)


def test_the_dag_param_latest_uses_the_marker(tmp_path: Path) -> None:
    from seqcls.airflow.context import settings_from_params
    from seqcls.airflow.roots import LATEST, locate_checkpoint

    root = tmp_path / "root"
    a = minimal_checkpoint(root / "a", seed=1)
    b = minimal_checkpoint(root / "b", seed=2)
    mark_complete(a, completed_at=T0 + timedelta(hours=1))
    mark_complete(b, completed_at=T0)
    _age(a)
    assert locate_checkpoint(LATEST, settings_from_params({}, checkpoints_root=root)) == a


def test_cli_marks_a_checkpoint_and_shows_latest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from seqcls.cli import main

    older = minimal_checkpoint(tmp_path / "root" / "older")
    newer = minimal_checkpoint(tmp_path / "root" / "newer", seed=1)
    assert main(["checkpoint", "mark-complete", str(older), "--run", "train-1"]) == 0
    assert main(["checkpoint", "mark-complete", str(newer), "--run", "train-2"]) == 0
    capsys.readouterr()
    assert main(["checkpoint", "latest", str(tmp_path / "root"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["checkpoint"] == str(newer) and shown["run"] == "train-2"
    assert shown["fingerprint"] == directory_fingerprint(newer)
    assert main(["checkpoint", "latest", str(tmp_path / "nothing-here")]) == 1  # a clear error, exit 1
