"""The state log rotated when large: whole lines moved into a compressed segment, never a line cut; the recorded
state recovered from the log and ``history`` read across segments exactly as before; a torn last line handled
as today; a writer waiting on the log's lock while it is rotated writes into the new log; gc rotates it."""

from __future__ import annotations

import fcntl
import gzip
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from seqcls.ops import gc as gc_mod
from seqcls.ops.gc import gc
from seqcls.ops.history import read_entries
from seqcls.serving.state import read_log
from seqcls.serving.statelog import append_line, log_path, read_lines, rotate, segments
from seqcls.settings import Settings
from tests.helpers.gc import NAME
from tests.helpers.gc import releases as _releases


@pytest.fixture
def settings(home: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(gc_mod, "_registry_fingerprints", lambda settings, model: {})
    monkeypatch.setenv("SEQCLS_GC_MLFLOW_VERSIONS", "keep")
    return Settings.from_env()


def test_rotation_moves_whole_lines_and_every_reader_sees_the_same_log(settings: Settings) -> None:
    repo = Path(str(settings.triton_repository))
    state = _releases(repo, 1, 40)  # more than the state's bounded history holds
    path = log_path(repo, NAME)
    with open(path, "ab") as fh:
        fh.write(b'{"generation": 999, "at": "2026-')  # a writer killed mid-line
    before = path.read_bytes()
    entries_before, damaged_before = read_entries(repo, NAME)
    recovered_before = read_log(repo, NAME)
    segment = rotate(path, max_bytes=1)
    assert segment is not None and segment.name.endswith(".000001.gz") and not path.exists()
    assert gzip.decompress(segment.read_bytes()) == before  # the whole file: no line cut, the torn one kept
    assert read_entries(repo, NAME) == (entries_before, damaged_before)  # the torn line still named damaged
    assert read_log(repo, NAME) == recovered_before
    state = _releases(repo, 41, 45, state)
    assert not path.read_bytes().startswith(b"\n")  # the new log starts on a line of its own
    assert rotate(path, max_bytes=1_000_000) is None  # small: left alone
    assert rotate(path, max_bytes=1) is not None
    _releases(repo, 46, 46, state)
    assert [s.name.rsplit(".", 2)[-2] for s in segments(path)] == ["000001", "000002"]
    entries, damaged = read_entries(repo, NAME)
    assert [e.to_version for e in entries if e.kind == "expose"] == list(range(1, 47))
    assert damaged == damaged_before
    recovered = read_log(repo, NAME)
    assert recovered is not None and recovered.serving == 46 and recovered.previous == 45
    pinned = [e for e in recovered.history if e.version == 45 and e.fingerprint]
    assert pinned, "the newest fingerprinted entry of each live version is kept"


def test_a_rotation_killed_before_compressing_loses_nothing_and_the_next_one_finishes_it(settings: Settings) -> None:
    repo = Path(str(settings.triton_repository))
    _releases(repo, 1, 5)
    path = log_path(repo, NAME)
    before = path.read_bytes()
    code = f"from pathlib import Path; from seqcls.serving.statelog import rotate; rotate(Path({str(path)!r}), 1)"
    env = {**os.environ, "SEQCLS_FAULT_PLAN": "die@statelog:rotated"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == -9, out.stderr[-2000:]
    (plain,) = segments(path)
    assert not plain.name.endswith(".gz") and plain.read_bytes() == before
    assert b"".join(line + b"\n" for line in read_lines(path)) == before
    _releases(repo, 6, 6, read_log(repo, NAME))
    assert rotate(path, max_bytes=1) is not None
    names = [s.name for s in segments(path)]
    assert all(n.endswith(".gz") for n in names) and len(names) == 2, names
    assert not any(p.name.endswith(".000001") for p in repo.iterdir())
    assert [e.to_version for e in read_entries(repo, NAME)[0] if e.kind == "expose"] == list(range(1, 7))


def test_a_writer_waiting_on_the_lock_while_the_log_rotates_writes_into_the_new_log(settings: Settings) -> None:
    repo = Path(str(settings.triton_repository))
    _releases(repo, 1, 2)
    path = log_path(repo, NAME)
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as rotate holds it
    writer = threading.Thread(target=append_line, args=(path, {"event": "promote", "at": "x", "version": 2}))
    writer.start()
    time.sleep(0.3)
    os.rename(path, path.with_name(path.name + ".000001"))
    os.close(fd)
    writer.join(10)
    assert b'"promote"' in path.read_bytes()
    assert b'"promote"' not in path.with_name(path.name + ".000001").read_bytes()


def test_gc_apply_rotates_a_large_state_log(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Path(str(settings.triton_repository))
    _releases(repo, 1, 3)
    monkeypatch.setenv("SEQCLS_STATELOG_ROTATE_BYTES", "1")
    settings = Settings.from_env()
    gc(settings)  # a dry run changes nothing
    assert not segments(log_path(repo, NAME))
    assert gc(settings, apply=True).ok
    assert len(segments(log_path(repo, NAME))) == 1
