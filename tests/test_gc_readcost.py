"""The state log's read cost bounded: after gc rotates it many times, state recovery reads the newest snapshot and
the live file, ``history --limit 20`` the newest segment or two — counted (segment files read), not timed — and
both give what a read of the whole log gives (pinned entries, damaged lines, line numbers, the MLflow join's
fingerprints). A rotation killed right after writing its snapshot loses nothing. The threshold is a setting."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from seqcls.errors import InputError
from seqcls.ops import gc as gc_mod
from seqcls.ops import history as history_mod
from seqcls.ops.gc import gc
from seqcls.serving.state import ServingState, read_log, write_state
from seqcls.serving.statelog import append_event, log_path, read_tail, segments, snapshot_path
from seqcls.settings import Settings
from tests.helpers.gc import NAME, check_models_file_param
from tests.helpers.gc import releases as _releases

SEGMENT = re.compile(r"\.log\.jsonl\.\d+(\.gz)?$")


@pytest.fixture
def settings(home: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(gc_mod, "_registry_fingerprints", lambda settings, model: {})
    monkeypatch.setattr(history_mod._Registry, "lookup", lambda self, model, fp, key: (None, {}))
    monkeypatch.setenv("SEQCLS_GC_MLFLOW_VERSIONS", "keep")
    monkeypatch.setenv("SEQCLS_STATELOG_ROTATE_BYTES", "1")  # every gc --apply rotates
    return Settings.from_env()


def _rollback(repo: Path, state: ServingState) -> ServingState:
    return write_state(repo, state.rolled_back("t", "drill"), expected_generation=state.generation)


def _segments_read(monkeypatch: pytest.MonkeyPatch, call: Callable[[], object]) -> int:
    """How many rotated segment files ``call`` reads (every reader reads a file with ``Path.read_bytes``)."""
    read: list[str] = []
    original = Path.read_bytes

    def spy(self: Path) -> bytes:
        if SEGMENT.search(self.name):
            read.append(self.name)
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", spy)
    try:
        call()
    finally:
        monkeypatch.setattr(Path, "read_bytes", original)
    return len(read)


def _whole(settings: Settings, tmp_path: Path) -> Settings:
    """The same repository without its snapshots: every reader reads the whole log, as before snapshots."""
    copy = tmp_path / "whole"
    shutil.copytree(settings.triton_repository, copy)
    for snap in copy.glob("*.snap"):
        snap.unlink()
    return Settings.from_env(triton_repository=str(copy))


def test_recovery_and_history_limit_read_no_more_segments_after_many_rotations(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed on the code before snapshots: both read every segment ((6, 6) after 6 rotations, (2, 2) after 2)."""
    repo = Path(str(settings.triton_repository))
    state, counts = None, {}
    for rotation in range(1, 7):
        state = _releases(repo, 8 * rotation - 7, 8 * rotation, state)
        assert gc(settings, apply=True).ok  # rotates the log: 16 entries a segment
        state = _releases(repo, 100 + rotation, 100 + rotation, state)
        counts[rotation] = (
            _segments_read(monkeypatch, lambda: read_log(repo, NAME)),
            _segments_read(monkeypatch, lambda: history_mod.history(settings, [NAME], limit=20)),
        )
    assert len(segments(log_path(repo, NAME))) == 6
    assert counts[6] == counts[2], counts
    assert counts[6][0] == 0 and counts[6][1] <= 1, counts
    assert _segments_read(monkeypatch, lambda: history_mod.history(settings, [NAME])) == 6  # the full history: all


def test_what_the_snapshots_give_is_what_the_whole_log_gives(settings: Settings, tmp_path: Path) -> None:
    repo = Path(str(settings.triton_repository))
    path = log_path(repo, NAME)
    state = _releases(repo, 1, 40)  # more than the bounded history holds
    append_event(repo, NAME, "refused", gate="quality", reason="worse", serving=40)
    with open(path, "ab") as fh:
        fh.write(b'{"generation": 999, "at": "2026-')  # a writer killed mid-line: the segment's last line
    assert gc(settings, apply=True).ok
    state = _releases(repo, 41, 70, state)
    assert gc(settings, apply=True).ok
    for _ in range(3):  # rollbacks after the cut: previous becomes a version released before it
        state = _rollback(repo, state)
    state = _releases(repo, 71, 72, state)
    assert gc(settings, apply=True).ok
    state = _rollback(repo, _rollback(repo, state))
    assert len(segments(path)) == 3 and snapshot_path(path, 3).is_file()
    whole = _whole(settings, tmp_path)
    wrepo = Path(str(whole.triton_repository))

    recovered = read_log(repo, NAME)
    assert recovered == read_log(wrepo, NAME) and recovered is not None
    assert recovered.serving == state.serving and recovered.previous == state.previous
    for v in recovered.live_versions():  # nothing pinned lost
        assert any(e.version == v and e.fingerprint for e in recovered.history), v

    for limit in (1, 20, 90, None):
        got = history_mod.history(settings, [NAME], limit=limit)
        want = history_mod.history(whole, [NAME], limit=limit)
        assert [e.to_dict() for e in got.entries] == [e.to_dict() for e in want.entries], limit
        assert got.omitted == want.omitted and got.notes == [n.replace(str(wrepo), str(repo)) for n in want.notes]
        assert any("damaged line(s)" in n for n in got.notes), got.notes  # the torn line, in a segment not read
    full = history_mod.read_recent(repo, NAME)
    recent = history_mod.read_recent(repo, NAME, 20)
    assert (recent.fingerprints, recent.named, recent.total, recent.damaged) == (
        full.fingerprints, full.named, full.total, full.damaged)  # fmt: skip
    assert recent.entries == full.entries[-len(recent.entries) :]
    assert recent.segments_read == 2  # 9 entries after snapshot 2, then segment 2 (61 entries)


def test_a_rotation_killed_after_its_snapshot_is_written_loses_nothing(settings: Settings) -> None:
    repo = Path(str(settings.triton_repository))
    path = log_path(repo, NAME)
    state = _releases(repo, 1, 5)
    assert gc(settings, apply=True).ok
    state = _releases(repo, 6, 9, state)
    before = (read_log(repo, NAME), history_mod.history(settings, [NAME]).entries)
    code = (
        "from pathlib import Path; from seqcls.contract.names import ModelName; from seqcls.ops.history import "
        f"rotate_log; rotate_log(Path({str(repo)!r}), ModelName('seqcls'), 1)"
    )
    env = {**os.environ, "SEQCLS_FAULT_PLAN": "die@statelog:snapshot-written"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == -9, out.stderr[-2000:]
    assert snapshot_path(path, 2).is_file() and len(segments(path)) == 1  # a snapshot of a segment not there
    assert (read_log(repo, NAME), history_mod.history(settings, [NAME]).entries) == before
    assert [len(c.lines) for c in read_tail(path).chunks] == [4 * 2]  # the live file, after snapshot 1
    _releases(repo, 10, 10, state)
    assert gc(settings, apply=True).ok  # writes snapshot 2 again, for the segment it makes
    assert len(segments(path)) == 2 and not path.exists()
    recovered = read_log(repo, NAME)
    assert recovered is not None and recovered.serving == 10 and recovered.previous == 9
    exposed = [e.to_version for e in history_mod.history(settings, [NAME], limit=4).entries if e.kind == "expose"]
    assert exposed == [9, 10]


def test_a_missing_or_damaged_snapshot_means_reading_the_whole_log(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo = Path(str(settings.triton_repository))
    path = log_path(repo, NAME)
    state = _releases(repo, 1, 6)
    assert gc(settings, apply=True).ok
    state = _releases(repo, 7, 12, state)
    assert gc(settings, apply=True).ok
    _releases(repo, 13, 13, state)
    want = (read_log(repo, NAME), [e.to_dict() for e in history_mod.history(settings, [NAME], limit=5).entries])
    snapshot_path(path, 2).write_bytes(b"{not json")
    got = (read_log(repo, NAME), [e.to_dict() for e in history_mod.history(settings, [NAME], limit=5).entries])
    assert got == want
    assert _segments_read(monkeypatch, lambda: read_log(repo, NAME)) == 1  # snapshot 1, then segment 2 and the rest


def test_the_rotation_threshold_is_a_setting_a_flag_a_dag_param_and_a_models_file_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqcls.airflow.params import run_params

    monkeypatch.delenv("SEQCLS_STATELOG_ROTATE_BYTES", raising=False)
    assert Settings.from_env().statelog_rotate_bytes == 256_000  # the default is unchanged
    monkeypatch.setenv("SEQCLS_STATELOG_ROTATE_BYTES", "64000")
    assert Settings.from_env().statelog_rotate_bytes == 64_000
    for bad in ("0", "-5"):
        monkeypatch.setenv("SEQCLS_STATELOG_ROTATE_BYTES", bad)
        with pytest.raises(InputError, match=rf"SEQCLS_STATELOG_ROTATE_BYTES / statelog_rotate_bytes .* got {bad}"):
            Settings.from_env()
    monkeypatch.setenv("SEQCLS_STATELOG_ROTATE_BYTES", "lots")
    with pytest.raises(InputError, match="SEQCLS_STATELOG_ROTATE_BYTES='lots'"):
        Settings.from_env()
    assert run_params("seqcls")["statelog_rotate_bytes"]["default"] is None
    check_models_file_param(tmp_path, "statelog_rotate_bytes", 64000, "0", r"params\.statelog_rotate_bytes")
    cli = [sys.executable, "-m", "seqcls.cli", "gc", "--statelog-rotate-bytes", "0"]
    out = subprocess.run(cli, capture_output=True)
    assert out.returncode == 2 and b"--statelog-rotate-bytes" in out.stderr


def test_gc_rotates_at_the_threshold_it_is_given(settings: Settings) -> None:
    repo = Path(str(settings.triton_repository))
    _releases(repo, 1, 3)
    path = log_path(repo, NAME)
    size = path.stat().st_size
    assert gc(settings, apply=True, statelog_rotate_bytes=size + 1).ok and not segments(path)
    assert gc(settings, apply=True, statelog_rotate_bytes=size).ok and len(segments(path)) == 1
    with pytest.raises(Exception, match="statelog_rotate_bytes must be a whole number of bytes ≥ 1, got 0"):
        gc(settings, statelog_rotate_bytes=0)


def test_a_snapshot_stays_the_same_size_after_hundreds_of_releases(settings: Settings, tmp_path: Path) -> None:
    """What a snapshot keeps is bounded (the newest changes and the versions they name), not one entry per version
    ever released — and recovery and ``history --limit`` still give what the whole log gives."""
    repo = Path(str(settings.triton_repository))
    path = log_path(repo, NAME)
    state, sizes = None, []
    for day in range(1, 361, 20):
        state = _releases(repo, day, day + 19, state)
        state = _rollback(repo, state)  # a rollback each rotation: previous walks back through older releases
        assert gc(settings, apply=True).ok
        sizes.append(snapshot_path(path, len(segments(path))).stat().st_size)
    state = _rollback(repo, _releases(repo, 361, 362, state))
    assert max(sizes[-6:]) <= 1.02 * min(sizes[-6:]), sizes  # flat from 120 releases on
    whole = _whole(settings, tmp_path)
    assert read_log(repo, NAME) == read_log(Path(str(whole.triton_repository)), NAME)
    got, want = history_mod.history(settings, [NAME], limit=20), history_mod.history(whole, [NAME], limit=20)
    assert [e.to_dict() for e in got.entries] == [e.to_dict() for e in want.entries] and got.omitted == want.omitted
