"""gc runs after a promote that moved the champion, not after one that found it there: a release of the champion
again changes nothing to collect, and gc's planning reads the registry (its cost grows with the versions)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from seqcls import cli
from seqcls.release.workspace import StepResult


@pytest.mark.parametrize(("already", "collected"), [(True, 0), (False, 1)])
def test_a_release_runs_gc_only_when_its_promote_moved_the_champion(
    monkeypatch: pytest.MonkeyPatch, already: bool, collected: int
) -> None:
    release = SimpleNamespace(workspace=SimpleNamespace(root="/nowhere"))
    promote = StepResult("promote", "ok", "/nowhere", summary={"already": already})
    calls: list[object] = []
    monkeypatch.setattr(cli, "_release_from_args", lambda args: release)
    monkeypatch.setattr(cli, "preflight", lambda release, servers: None)
    monkeypatch.setattr(cli, "run_release", lambda release, until: [promote])
    monkeypatch.setattr(cli, "after_promote", calls.append)
    code, _ = cli._cmd_release(argparse.Namespace(until=None))
    assert code == 0 and calls == [release] * collected


@pytest.mark.parametrize(("already", "collected"), [(True, 0), (False, 1)])
def test_the_promote_command_runs_gc_only_when_it_moved_the_champion(
    monkeypatch: pytest.MonkeyPatch, already: bool, collected: int
) -> None:
    release = SimpleNamespace(workspace=SimpleNamespace(root="/nowhere"))
    calls: list[object] = []
    monkeypatch.setattr(cli, "_release_from_args", lambda args: release)
    monkeypatch.setattr(
        cli, "step", lambda name: lambda release: StepResult(name, "ok", "/nowhere", summary={"already": already})
    )
    monkeypatch.setattr(cli, "after_promote", calls.append)
    code, _ = cli._cmd_step(argparse.Namespace(command="promote", reason=None))
    assert code == 0 and calls == [release] * collected
