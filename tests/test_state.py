"""The recorded serving state: atomic, optimistic writes, readable failures, and pure transitions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from seqcls.errors import ServingError
from seqcls.serving.state import (
    ServingState,
    backup_path,
    current_state,
    infer_legacy_state,
    read_state,
    state_path,
    write_state,
)

NAME = ModelName("seqcls")


def _released(*versions: int) -> ServingState:
    s = ServingState.empty(NAME)
    for v in versions:
        s = s.with_candidate(v, f"fp{v}", "run-test").promoted(v, f"fp{v}", "run-test")
    return s


def test_absent_state_is_empty(tmp_path: Path) -> None:
    s = read_state(tmp_path, NAME)
    assert (s.serving, s.previous, s.candidate, s.generation, s.history) == (None, None, None, 0, [])


def test_round_trip_and_backup(tmp_path: Path) -> None:
    s = _released(1)
    w1 = write_state(tmp_path, s, expected_generation=0)
    assert w1.generation == 1 and w1.updated_at
    assert read_state(tmp_path, NAME) == w1
    path = state_path(tmp_path, NAME)
    assert path == tmp_path / ".seqcls-state.seqcls.json" and path.is_file()
    assert not [p for p in tmp_path.iterdir() if p.is_dir()], "Triton would list a directory as a model"
    w2 = write_state(tmp_path, w1.with_candidate(2, "fp2", "run-2"), expected_generation=1)
    assert read_state(tmp_path, NAME) == w2 and w2.generation == 2 and w2.candidate == 2
    assert ServingState.from_dict(json.loads(backup_path(path).read_text())) == w1
    assert not list(tmp_path.glob("*.tmp"))


def test_crash_before_rename_keeps_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w1 = write_state(tmp_path, _released(1), expected_generation=0)
    path = state_path(tmp_path, NAME)
    before = path.read_bytes()
    real_replace = os.replace

    def crash(src, dst):
        if Path(dst) == path:
            raise OSError("simulated crash between temp write and rename")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        write_state(tmp_path, w1.with_candidate(2, "fp2", "run-2"), expected_generation=1)
    assert path.read_bytes() == before
    assert read_state(tmp_path, NAME) == w1
    assert not list(tmp_path.glob("*.tmp")), "temp file left behind"


@pytest.mark.parametrize(
    "content, what",
    [
        ('{"model_name": "seqcls", "serving": 1', "Expecting"),
        ("", "Expecting value"),
        ('{"model_name": "seqcls"}', "missing field"),
        ('{"model_name": "seqcls", "serving": "two", "previous": null, "candidate": null, "generation": 1}', "serving"),
        ('{"model_name": "other", "serving": 1, "previous": null, "candidate": null, "generation": 1}', "other"),
    ],
)
def test_corrupt_file_names_file_and_backup(tmp_path: Path, content: str, what: str) -> None:
    w1 = write_state(tmp_path, _released(1), expected_generation=0)
    write_state(tmp_path, w1.with_candidate(2, None, "run-2"), expected_generation=1)
    path = state_path(tmp_path, NAME)
    path.write_text(content)
    with pytest.raises(ServingError) as info:
        read_state(tmp_path, NAME)
    msg = str(info.value)
    assert str(path) in msg and what in msg
    assert str(backup_path(path)) in msg and "seqcls sync --model-name seqcls" in msg
    with pytest.raises(ServingError):  # never written over blindly
        write_state(tmp_path, w1, expected_generation=2)


def test_generation_conflict_refused(tmp_path: Path) -> None:
    base = read_state(tmp_path, NAME)
    mine, theirs = base.with_candidate(1, "fp1", "run-a"), base.with_candidate(2, "fp2", "run-b")
    write_state(tmp_path, theirs, expected_generation=base.generation)
    with pytest.raises(ServingError, match=r"generation 1.*run-b.*generation 0"):
        write_state(tmp_path, mine, expected_generation=base.generation)
    assert read_state(tmp_path, NAME).candidate == 2


def test_transitions() -> None:
    s = ServingState.empty(NAME).with_candidate(1, "fp1", "r1")
    assert (s.serving, s.previous, s.candidate) == (None, None, 1) and s.live_versions() == [1]
    s = s.promoted(1, "fp1", "r1")
    assert (s.serving, s.previous, s.candidate) == (1, None, None)
    s = s.with_candidate(2, "fp2", "r2")
    assert s.live_versions() == [1, 2] and s.serving == 1
    with pytest.raises(ServingError, match="already the candidate"):
        s.with_candidate(3, "fp3", "r3")
    with pytest.raises(ServingError, match="only the smoked candidate"):
        s.promoted(3, "fp3", "r3")
    s = s.promoted(2, "fp2", "r2")
    assert (s.serving, s.previous, s.candidate) == (2, 1, None)
    s = s.with_candidate(3, "fp3", "r3").promoted(3, "fp3", "r3")
    assert (s.serving, s.previous) == (3, 2)
    s = s.promoted(3, "fp3", "r3-again")  # re-releasing what is served keeps the warm previous
    assert (s.serving, s.previous) == (3, 2)
    s = s.rolled_back("cli:h:1", "bad answers")
    assert (s.serving, s.previous) == (2, 1)
    assert s.history[-1].action == "rollback" and s.history[-1].fingerprint == "fp2"
    assert s.history[-1].note == "bad answers"
    s = s.rolled_back("cli:h:1")
    assert (s.serving, s.previous) == (1, None)
    with pytest.raises(ServingError, match="no previous version"):
        s.rolled_back("cli:h:1")
    s = s.with_candidate(4, "fp4", "r4").without_candidate("r4", "smoke failed")
    assert (s.serving, s.previous, s.candidate) == (1, None, None)
    assert s.history[-1].action == "abandon" and s.history[-1].version == 4
    assert s.without_candidate("r5") is s
    s = s.with_candidate(4, "fp4", "r4").promoted(4, "fp4", "r4").rolled_back("op")
    assert (s.serving, s.previous) == (1, None), "1 was first released with nothing before it"


def test_rollback_with_no_previous_refused() -> None:
    with pytest.raises(ServingError, match="nothing to roll back to"):
        ServingState.empty(NAME).rolled_back("op")
    with pytest.raises(ServingError, match="nothing to roll back to"):
        _released(1).rolled_back("op")


def test_history_keeps_last_50() -> None:
    s = _released(*range(1, 40))
    assert len(s.history) == 50 and s.history[-1].version == 39
    assert ServingState.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def _legacy_repo(root: Path, ensemble: list[int], composing: list[int]) -> None:
    def policy(vs: list[int]) -> str:
        return f"version_policy: {{ specific: {{ versions: [ {', '.join(map(str, vs))} ] }} }}"

    for model, vs in [("seqcls", ensemble), ("tokenizer", composing), ("seqcls_model", composing),
                      ("seqcls_postprocess", composing)]:  # fmt: skip
        (root / model).mkdir(parents=True)
        (root / model / "config.pbtxt").write_text(f'name: "{model}"\nmax_batch_size: 64\n{policy(vs)}\n')
        for v in composing:
            (root / model / str(v)).mkdir()
            info = {"version": v, "model": model, "fingerprint": f"fp{v}"}
            (root / model / str(v) / "release.json").write_text(json.dumps(info))


def test_legacy_repository_is_adopted(tmp_path: Path) -> None:
    _legacy_repo(tmp_path, [2], [1, 2])
    s = infer_legacy_state(tmp_path, NAME)
    assert (s.serving, s.previous, s.candidate, s.generation) == (2, 1, None, 0)
    assert s.history[-1].action == "adopt" and s.history[-1].fingerprint == "fp2"
    assert current_state(tmp_path, NAME) == s
    written = write_state(tmp_path, s, expected_generation=0)
    assert current_state(tmp_path, NAME) == written
    assert written.rolled_back("op").serving == 1


def test_legacy_single_version_and_empty(tmp_path: Path) -> None:
    _legacy_repo(tmp_path / "a", [3], [3])
    s = infer_legacy_state(tmp_path / "a", NAME)
    assert (s.serving, s.previous) == (3, None)
    empty = infer_legacy_state(tmp_path / "none", NAME)
    assert empty.serving is None and empty.history == []


WRITER = """
import sys
from pathlib import Path
from seqcls.errors import ServingError
from seqcls.serving.state import read_state, write_state
from seqcls.contract.names import ModelName
repo, me, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
done = conflicts = 0
while done < n:
    s = read_state(repo, ModelName("seqcls"))
    try:
        write_state(repo, s.with_candidate(1, None, me).without_candidate(me), expected_generation=s.generation)
        done += 1
    except ServingError:
        conflicts += 1
print(conflicts)
"""


def test_concurrent_writers_lose_no_update(tmp_path: Path) -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-c", WRITER, str(tmp_path)]
    procs = [subprocess.Popen([*cmd, f"w{i}", "15"], stdout=subprocess.PIPE, text=True) for i in range(3)]
    for p in procs:
        p.communicate(timeout=60)
        assert p.returncode == 0
    s = read_state(tmp_path, NAME)
    assert s.generation == 45, "an optimistic write was lost"
    assert not list(tmp_path.glob("*.tmp"))
