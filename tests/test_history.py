"""``seqcls history``: the serving log read back, joined with MLflow — units on hand-written logs, then
one drill through the real parts (two releases, a rollback, a parity refusal)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from seqcls import cli
from seqcls.contract.names import ModelName
from seqcls.errors import GateError
from seqcls.ops.history import History, history, lines, version_label
from seqcls.serving.state import (
    ServingState,
    append_event,
    current_state,
    log_path,
    read_log,
    state_path,
    write_state,
)
from seqcls.settings import Settings
from tests.helpers.drills import Drill

MODEL = ModelName("seqcls")
FP_A, FP_B, FP_C = "a" * 64, "b" * 64, "c" * 64


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(home=tmp_path / "home", triton_repository=tmp_path / "repo")


def _released(repo: Path) -> ServingState:
    """Two releases and a rollback, written as the steps write them (write_state → the log)."""
    s = write_state(repo, ServingState.empty(MODEL).with_candidate(1, FP_A, "release:a"), expected_generation=0)
    s = write_state(repo, s.promoted(1, FP_A, "release:a"), expected_generation=s.generation)
    s = write_state(repo, s.with_candidate(2, FP_B, "release:b"), expected_generation=s.generation)
    s = write_state(repo, s.promoted(2, FP_B, "release:b"), expected_generation=s.generation)
    return write_state(repo, s.rolled_back("rollback:seqcls:cli", "too many refunds"), expected_generation=s.generation)


class _FakeVersion:
    def __init__(self, version: int, run_id: str | None = None) -> None:
        self.version, self.run_id = str(version), run_id


def _fake_registry(monkeypatch: pytest.MonkeyPatch, by_fp: dict[str, int]) -> None:
    """An MLflow whose version ``by_fp[fp]`` holds fingerprint ``fp`` (its run: both gates passed)."""
    import seqcls.ops.history as ledger  # where the join looks them up

    class Run:
        data = type("RunData", (), {"tags": {"seqcls.gates.parity": "passed", "seqcls.gates": "skipped"}})

    class Client:
        def get_run(self, run_id: str) -> Run:
            return Run()

    monkeypatch.setattr(ledger, "client", lambda settings: Client())
    monkeypatch.setattr(
        ledger,
        "find_version",
        lambda c, name, fp, release_key=None: _FakeVersion(by_fp[fp], "run-1") if fp in by_fp else None,
    )


def _mlflow_down(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import seqcls.ops.history as ledger  # where the join looks them up

    calls: list[int] = []

    def down(settings: Settings):
        calls.append(1)
        raise ConnectionError("http://mlflow:5000: Connection refused")

    monkeypatch.setattr(ledger, "client", down)
    return calls


# ---------------------------------------------------------------------------- the writer


def test_every_state_line_says_who_and_what_it_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "seqcls_release")
    monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", "manual__2025-01-01")
    monkeypatch.setenv("AIRFLOW_CTX_TRY_NUMBER", "2")
    _released(tmp_path)
    records = [json.loads(line) for line in log_path(tmp_path, MODEL).read_text().splitlines()]
    assert [r["before"]["serving"] for r in records] == [None, None, 1, 1, 2]
    assert [r["state"]["serving"] for r in records] == [None, 1, 1, 2, 1]
    who = records[-1]["who"]
    assert who["pid"] > 0 and who["user"] and who["host"]
    assert (who["dag_id"], who["run_id"], who["try"]) == ("seqcls_release", "manual__2025-01-01", "2")


def test_event_lines_leave_the_state_log_readable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A refusal in the log is not a damaged line: the recovered state still reads, without a warning."""
    written = _released(tmp_path)
    assert append_event(tmp_path, MODEL, "refused", gate="quality", fingerprint=FP_C, serving=1, reason="no")
    with caplog.at_level("WARNING"):
        logged = read_log(tmp_path, MODEL)
    assert logged is not None and (logged.serving, logged.candidate, logged.generation) == (1, None, written.generation)
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]
    state_path(tmp_path, MODEL).unlink()  # a lost state file: reconstructed from the log, events and all
    assert current_state(tmp_path, MODEL).serving == 1


def test_a_log_that_cannot_be_written_never_raises(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the repository should be")
    assert append_event(blocked, MODEL, "refused", gate="parity", fingerprint=FP_A, reason="x") is False
    assert append_event(tmp_path, MODEL, "no-such-event") is False


def test_a_parity_refusal_is_logged_with_its_gate_and_reason(tiny_checkpoint: Path, home: Path) -> None:
    from seqcls.release.intake import open_release
    from seqcls.steps import run_release

    vocab = (tiny_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[vocab.index("公")] = "公 "  # the serving tokenizer trims it: the parity gate refuses
    (tiny_checkpoint / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    release = open_release(tiny_checkpoint)
    root = Path(str(release.settings.triton_repository))
    with pytest.raises(GateError):
        run_release(release, until="validate")
    assert not root.exists() or not any(root.iterdir())  # never released: the repository stays as it was
    assert append_event(root, MODEL, "promote", version=1)  # a model with a history (released before)
    with pytest.raises(GateError) as refused:
        run_release(release, until="validate")
    records = [json.loads(line) for line in log_path(root, MODEL).read_text().splitlines()]
    assert [r["event"] for r in records] == ["promote", "refused"]
    assert records[1]["gate"] == "parity" and records[1]["fingerprint"] == release.checkpoint.fingerprint
    assert records[1]["reason"] == str(refused.value).splitlines()[0] and records[1]["serving"] is None
    assert records[1]["who"]["pid"] > 0


# ---------------------------------------------------------------------------- the reader


def test_history_reads_every_kind_of_line_oldest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(tmp_path)
    repo = Path(str(settings.triton_repository))
    _released(repo)
    append_event(repo, MODEL, "refused", gate="quality", fingerprint=FP_C, serving=1, reason="Quality gate refused")
    _fake_registry(monkeypatch, {FP_A: 1, FP_B: 2})
    result = history(settings)
    assert [(e.kind, e.from_version, e.to_version) for e in result.entries] == [
        ("release-candidate", None, 1),
        ("expose", None, 1),
        ("release-candidate", 1, 2),
        ("expose", 1, 2),
        ("rollback", 2, 1),
        ("refused", 1, 1),
    ]
    assert result.notes == [] and result.registry
    expose_b, rollback, refused = result.entries[3], result.entries[4], result.entries[5]
    assert expose_b.change() == "Triton v1 (MLflow v1) → Triton v2 (MLflow v2)"
    assert expose_b.gates == {"parity": "passed", "quality": "skipped"} and expose_b.fingerprint == FP_B
    assert rollback.change() == "Triton v2 (MLflow v2) → Triton v1 (MLflow v1)"
    assert rollback.reason == "too many refunds" and rollback.by == "rollback:seqcls:cli"
    assert refused.change() == "Triton v1 (MLflow v1) unchanged" and refused.gates == {"quality": "failed"}
    assert json.loads(json.dumps(refused.to_dict()))["from"] == "Triton v1 (MLflow v1)"


def test_damaged_lines_and_old_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines written before who/before existed still read; damaged ones are skipped and named."""
    settings = _settings(tmp_path)
    repo = Path(str(settings.triton_repository))
    repo.mkdir(parents=True)
    old = {"serving": None, "previous": None, "candidate": 3, "published": 3, "updated_at": "x", "generation": 1}
    entry = {"version": 3, "fingerprint": FP_A, "action": "candidate", "at": "2024-01-01T00:00:00Z", "by": "run-7"}
    entry2 = {**entry, "action": "release", "at": "2024-01-01T00:01:00Z"}
    log_path(repo, MODEL).write_text(
        json.dumps({"generation": 1, "at": "x", "state": old, "entries": [entry]})
        + "\n\x00\x01 not json\n"
        + json.dumps(
            {"generation": 2, "at": "x", "state": {**old, "serving": 3, "candidate": None}, "entries": [entry2]}
        )
        + '\n{"generation": 3, "state": {}, "entries": [{"action": "teleport"}]}\n'
    )
    _fake_registry(monkeypatch, {FP_A: 4})
    result = history(settings, [MODEL])
    assert [(e.kind, e.change(), e.by) for e in result.entries] == [
        ("release-candidate", "nothing → Triton v3 (MLflow v4)", "run-7"),
        ("expose", "nothing → Triton v3 (MLflow v4)", "run-7"),
    ]
    assert result.notes == [f"{log_path(repo, MODEL)}: 2 damaged line(s) skipped (line 2, 4)"]


def test_a_record_written_after_a_torn_line_is_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer killed mid-line leaves no newline: the next record must start a line of its own, not be
    glued onto the torn one and lost with it (what the registry journal already guards against)."""
    settings = _settings(tmp_path)
    repo = Path(str(settings.triton_repository))
    _released(repo)
    with log_path(repo, MODEL).open("ab") as fh:
        fh.write(b'{"event": "refused", "gate": "parity", "reas')  # torn: a kill in the middle of a write
    assert append_event(repo, MODEL, "refused", gate="quality", reason="micro-F1 0.888 < 0.990", fingerprint=FP_A)
    _fake_registry(monkeypatch, {FP_A: 4})
    result = history(settings, [MODEL])
    refused = [e for e in result.entries if e.kind == "refused"]
    assert [(e.gate, e.reason) for e in refused] == [("quality", "micro-F1 0.888 < 0.990")], result.entries
    assert any("1 damaged line(s) skipped" in n for n in result.notes), result.notes


def test_mlflow_unreachable_gives_the_triton_numbers_and_one_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path)
    _released(Path(str(settings.triton_repository)))
    calls = _mlflow_down(monkeypatch)
    result = history(settings)
    assert len(result.entries) == 5 and not result.registry and len(calls) == 1  # asked once, not per version
    assert result.entries[3].change(registry=False) == "Triton v1 → Triton v2"
    assert result.entries[3].from_mlflow is None and result.entries[3].to_mlflow is None
    assert (
        len(result.notes) == 1 and "MLflow was unreachable (http://mlflow:5000: Connection refused)" in result.notes[0]
    )
    table = lines(result)
    assert "Triton v2 → Triton v1" in table[5] and "too many refunds" in table[5]
    assert table[-1].startswith("note: MLflow was unreachable")


def test_version_vocabulary() -> None:
    assert version_label(5, 1) == "Triton v5 (MLflow v1)"
    assert version_label(5, None) == "Triton v5 (not in MLflow)"
    assert version_label(5, None, registry=False) == "Triton v5"
    assert version_label(None) == "nothing"


def test_cli_table_limit_json_and_a_bad_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("SEQCLS_TRITON_REPOSITORY", str(tmp_path / "repo"))
    _released(tmp_path / "repo")
    _fake_registry(monkeypatch, {FP_A: 1, FP_B: 2})
    assert cli.main(["history", "--limit", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["when", "model", "kind"] and "3 older change(s) not shown" in out[1]
    assert "expose" in out[2] and "Triton v1 (MLflow v1) → Triton v2 (MLflow v2)" in out[2]
    assert "rollback" in out[3] and "too many refunds" in out[3] and "@" in out[3]
    assert cli.main(["history", "--model-name", MODEL, "--json", "--limit", "1"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [e["kind"] for e in payload["entries"]] == ["rollback"] and payload["notes"] == []
    assert cli.main(["history", "--model-name", "../etc"]) == 2
    assert "is not allowed" in capsys.readouterr().err
    assert cli.main(["history", "--model-name", "other"]) == 0  # a valid name with no log: nothing to show
    assert capsys.readouterr().out.startswith("no serving change recorded")


def test_history_of_nothing(tmp_path: Path) -> None:
    result = history(_settings(tmp_path))
    assert isinstance(result, History) and result.entries == [] and result.notes == []


# ---------------------------------------------------------------------------- the limit


def _releases(repo: Path, model: ModelName, days: int) -> None:
    """``days`` daily releases as the steps log them: a candidate, its exposure and the champion's move (its
    MLflow numbers), every 10th a quality refusal instead, every 7th followed by a rollback."""
    s, version, champion = ServingState.empty(model), 0, None
    for day in range(1, days + 1):
        fp = f"{day:064x}"
        if day % 10 == 0:
            append_event(repo, model, "refused", gate="quality", fingerprint=fp, serving=s.serving, reason="worse")
            continue
        version += 1
        s = write_state(repo, s.with_candidate(version, fp, f"release:{day}"), expected_generation=s.generation)
        s = write_state(repo, s.promoted(version, fp, f"release:{day}"), expected_generation=s.generation)
        append_event(
            repo, model, "promote", version=version, fingerprint=fp, mlflow=100 + day, mlflow_previous=champion
        )
        champion = 100 + day
        if day % 7 == 0:
            s = write_state(repo, s.rolled_back("rollback:cli", f"day {day}"), expected_generation=s.generation)


def _counting_registry(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """An MLflow holding day ``d``'s release (fingerprint ``d``) as version 100 + d; the fingerprints asked."""
    import seqcls.ops.history as ledger

    asked: list[str | None] = []

    def find_version(c, name, fp, release_key=None):
        asked.append(fp)
        return _FakeVersion(100 + int(fp, 16), "run-1") if fp else None

    _fake_registry(monkeypatch, {})
    monkeypatch.setattr(ledger, "find_version", find_version)
    return asked


def test_history_limit_asks_mlflow_for_the_shown_entries_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``history --limit 20`` runs every day for years: its MLflow lookups must follow the limit, not the
    number of releases ever made (they did: every version of the log was looked up, then the list cut)."""
    monkeypatch.setenv("SEQCLS_TRITON_REPOSITORY", str(tmp_path / "repo"))
    _releases(tmp_path / "repo", MODEL, 80)
    asked = _counting_registry(monkeypatch)
    full = history(_settings(tmp_path))
    assert len(full.entries) >= 200 and len(asked) >= 70  # every version the log names
    asked.clear()
    assert cli.main(["history", "--limit", "20"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(asked) <= 20, f"{len(asked)} MLflow lookups for 20 shown entries of {len(full.entries)}"
    assert f"{len(full.entries) - 20} older change(s) not shown (--limit 20)" in table[1]
    assert len(table) == 2 + 20 and table[-1] == lines(full, 20)[-1]


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 20, 1000])
def test_history_limit_gives_the_newest_entries_exactly_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, limit: int
) -> None:
    """The cut moved before the join: the same newest entries, in the same order, with the same fields —
    across two models, and for a champion move whose old champion only older lines name."""
    monkeypatch.setenv("SEQCLS_TRITON_REPOSITORY", str(tmp_path / "repo"))
    repo = tmp_path / "repo"
    _releases(repo, MODEL, 15)
    _releases(repo, ModelName("other"), 4)
    append_event(repo, MODEL, "promote", version=1, mlflow=101, mlflow_previous=114)  # back to day 1's release
    _counting_registry(monkeypatch)
    full = history(_settings(tmp_path)).to_dict()
    assert full["entries"][-1]["kind"] == "promote" and full["entries"][-1]["from_version"] == 13
    limited = history(_settings(tmp_path), limit=limit)
    assert limited.to_dict() == {**full, "entries": full["entries"][-limit:]}
    assert limited.omitted == max(0, len(full["entries"]) - limit)
    assert cli.main(["history", "--json", "--limit", str(limit)]) == 0
    assert json.loads(capsys.readouterr().out) == {**full, "entries": full["entries"][-limit:]}
    with pytest.raises(ValueError, match="limit"):
        history(_settings(tmp_path), limit=0)


# ---------------------------------------------------------------------------- through the real parts


@pytest.mark.integration
def test_drill_two_releases_a_rollback_and_a_refusal(
    drill: Drill, tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path, tiny_checkpoint: Path
) -> None:
    from seqcls.steps.rollback import rollback_model

    t0 = time.monotonic()
    drill.release(tiny_checkpoint_src)
    drill.release(tiny_checkpoint_b_src)
    rollback_model(drill.settings, MODEL, reason="drill: B misroutes refunds", by="test")
    vocab = (tiny_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[vocab.index("公")] = "公 "  # the parity gate refuses this one
    (tiny_checkpoint / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    with pytest.raises(GateError):
        drill.release(tiny_checkpoint)
    drill.assert_invariant(served=1)

    out = drill.cli("history", "--json")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    got = [(e["kind"], e["from"], e["to"]) for e in payload["entries"]]
    assert got == [
        ("release-candidate", "nothing", "Triton v1 (MLflow v1)"),
        ("expose", "nothing", "Triton v1 (MLflow v1)"),
        ("promote", "nothing", "Triton v1 (MLflow v1)"),
        ("release-candidate", "Triton v1 (MLflow v1)", "Triton v2 (MLflow v2)"),
        ("expose", "Triton v1 (MLflow v1)", "Triton v2 (MLflow v2)"),
        ("promote", "Triton v1 (MLflow v1)", "Triton v2 (MLflow v2)"),
        ("rollback", "Triton v2 (MLflow v2)", "Triton v1 (MLflow v1)"),
        ("refused", "Triton v1 (MLflow v1)", "Triton v1 (MLflow v1)"),
    ], got
    entries = payload["entries"]
    assert entries[4]["gates"]["parity"] == "passed" and entries[6]["reason"] == "drill: B misroutes refunds"
    assert entries[7]["gate"] == "parity" and entries[7]["reason"].startswith("Parity gate failed")
    assert all(e["who"]["pid"] > 0 for e in entries) and payload["notes"] == []
    table = drill.cli("history")
    assert table.returncode == 0, table.stderr
    sys.stderr.write("\n$ seqcls history\n" + table.stdout)  # the README's sample (pytest -s shows it)
    assert "Triton v2 (MLflow v2) → Triton v1 (MLflow v1)" in table.stdout
    # one version vocabulary in status too, and MLflow tags that say only what is true (issue 25)
    status = drill.cli("status")
    sys.stderr.write("\n$ seqcls status\n" + status.stdout)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.startswith("seqcls: serving Triton v1 (MLflow v1), fingerprint "), status.stdout
    assert "MLflow: champion Triton v1 (MLflow v1)" in status.stdout
    from seqcls.registry.ledger import client

    tags = {int(v.version): v.tags for v in client(drill.settings).search_model_versions(f"name = '{MODEL}'")}
    assert [v for v in sorted(tags) if "champion_since" in tags[v]] == [1]  # only the champion says since when
    assert all(not any(t.startswith(("version.torch", "version.transformers")) for t in tags[v]) for v in tags)
    assert all(tags[v]["version.paddlepaddle"] and tags[v]["released_by"].count("@") == 1 for v in tags)
    assert tags[2]["checkpoint"] == str(tiny_checkpoint_b_src) and "airflow.run_id" not in tags[2]
    assert time.monotonic() - t0 < 120, "the history drill is meant to be quick"
