"""The way out of a damaged served version (issue 37), through a real local Triton and MLflow.

Each published version's ``release.json`` (every file hash) is pinned outside its directory, beside the
serving state, so ``seqcls sync`` restores a deleted or partly deleted version byte-identically from its
release workspace — and what it restored loads after a Triton restart.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.contract.names import ModelName
from seqcls.errors import ServingError
from seqcls.ops.status import status
from seqcls.release.workspace import Workspace
from seqcls.serving import restore
from seqcls.serving.pins import write_pin
from seqcls.serving.repository import Repository
from seqcls.serving.state import read_state, state_path, write_state
from seqcls.serving.statelog import log_path
from tests.helpers.demo_models import demo_eval_file, quick_demo_model
from tests.helpers.drills import Drill, drill_test, served_answers

NAME = ModelName("seqcls")


def _version_files(d: Drill, version: int, model_name: str = NAME) -> dict[str, str]:
    """Every file of ``version`` in every Triton model of ``model_name``: relative path → sha256."""
    out = {}
    for model in ModelName(model_name).names.models:
        vdir = d.repo / model / str(version)
        out |= {str(p.relative_to(d.repo)): sha256_file(p) for p in sorted(vdir.rglob("*")) if p.is_file()}
    return out


def _no_traceback(out) -> None:
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


@drill_test
def test_a_deleted_served_version_is_restored_by_one_sync_and_survives_a_restart(
    drill: Drill, tiny_checkpoint_src: Path
) -> None:
    d = drill
    d.release(tiny_checkpoint_src)
    before, files = served_answers(d, NAME), _version_files(d, 1)
    names = NAME.names
    # partly deleted: the graph and the record of its hashes
    (d.repo / names.model / "1" / "model.onnx").unlink()
    (d.repo / names.model / "1" / "release.json").unlink()
    assert [c[1:] for c in _fixes(d, "served version 1")] == [["sync", "--model-name", NAME]]
    out = d.cli("sync")
    _no_traceback(out)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert _version_files(d, 1) == files  # byte-identical, release.json included
    # every directory of the served version deleted (a lost volume): one sync puts it back
    for model in names.models:
        shutil.rmtree(d.repo / model / "1")
    assert [c[1:] for c in _fixes(d, "served version 1")] == [["sync", "--model-name", NAME]]
    out = d.cli("sync", "--json")
    _no_traceback(out)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert any("restored" in a for a in json.loads(out.stdout)[0]["actions"]), out.stdout[-3000:]
    assert _version_files(d, 1) == files
    # what sync restored is what a restarted Triton loads
    d.server.stop()
    out = d.cli("triton", "start")
    try:
        _no_traceback(out)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert served_answers(d, NAME) == before
        _status_agrees(d)
    finally:
        assert d.cli("triton", "stop").returncode == 0
        d.server.start()
    assert d.cli("sync").returncode == 0
    d.assert_invariant(served=1)


@drill_test
def test_a_new_release_proceeds_when_no_copy_of_the_damaged_served_version_exists(
    drill: Drill, tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path
) -> None:
    d = drill
    d.release(tiny_checkpoint_src)
    # the served version lost with a volume, and nothing records its files any more (no pin: as a version
    # published before pins was)
    for model in NAME.names.models:
        shutil.rmtree(d.repo / model / "1")
    for pin in d.repo.glob(".seqcls-pins.*"):
        pin.unlink()
    out = d.cli("sync")
    assert out.returncode == 1 and "served version 1" in out.stdout, out.stdout[-3000:]
    out = d.cli("release", "--checkpoint", str(tiny_checkpoint_b_src))
    _no_traceback(out)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "served version 1" in out.stderr and "no verified copy" in out.stderr, out.stderr[-3000:]
    assert (d.state().serving, d.state().previous) == (2, None)
    history = d.cli("history", "--json")
    assert history.returncode == 0 and "no verified copy" in history.stdout, history.stdout[-3000:]
    assert d.cli("sync").returncode == 0
    d.assert_invariant(served=2)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quick_demo_model(tmp_path_factory).path


@pytest.fixture(scope="module")
def eval_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_eval_file(tmp_path_factory.mktemp("eval") / "test.txt")


def _champion_from_mlflow(d: Drill, tmp_path: Path) -> None:
    """The served graph gone from the repository (every version holding it) and its workspace: the MLflow
    version's artifacts, checked against the pin, are the champion's verified copy."""
    from seqcls.registry.ledger import version_artifacts
    from seqcls.release.keys import served_release_key
    from seqcls.serving.published import champion_graph

    repo, version = Repository.from_settings(d.settings, NAME), d.state().serving
    recorded = repo.recorded(version, NAME.names.model)
    digest, workspace = recorded["files"]["model.onnx"], Path(recorded["workspace"])
    (d.repo / NAME.names.model / str(version) / "model.onnx").unlink()
    found = [*workspace.rglob("*"), *d.repo.rglob("*")]  # the workspace, and the other versions holding it
    copies = [p for p in sorted(found) if p.is_file() and not p.is_symlink() and sha256_file(p) == digest]
    aside = {p: tmp_path / f"aside-{i}" for i, p in enumerate(copies)}
    for path, away in aside.items():
        shutil.move(path, away)
    try:
        with pytest.raises(ServingError, match="no verified copy"):
            champion_graph(repo, version, tmp_path / "without")
        key = served_release_key(repo, version)
        mlflow = version_artifacts(d.settings, NAME, d.state().fingerprint_of(version), key, tmp_path / "mlflow")
        assert mlflow is not None
        graph, source = champion_graph(repo, version, tmp_path / "with", [mlflow])
        assert "verified copy" in source and graph.version == version
    finally:
        for path, away in aside.items():
            shutil.move(away, path)


@drill_test
def test_the_champion_is_rescored_from_a_verified_copy_or_the_refusal_names_the_override(
    drill: Drill, good: Path, eval_set: Path, tmp_path: Path
) -> None:
    d, names = drill, NAME.names
    d.release(good, eval_set=str(eval_set))
    (d.repo / names.model / "1" / "model.onnx").unlink()  # the champion's graph gone; its pin and workspace hold it
    out = d.cli("release", "--checkpoint", str(good), "--eval-set", str(eval_set), "--threshold", "0.45")
    _no_traceback(out)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "champion Triton v1" in out.stderr and "verified copy" in out.stderr, out.stderr[-3000:]
    assert d.state().serving == 2
    _champion_from_mlflow(d, tmp_path)
    # the champion's graph directory gone and nothing records its hashes any more: refused, naming what is
    # missing and the override
    shutil.rmtree(d.repo / names.model / "2")
    for pin in d.repo.glob(".seqcls-pins.*"):
        pin.unlink()
    release = ["release", "--checkpoint", str(good), "--eval-set", str(eval_set), "--threshold", "0.4"]
    out = d.cli(*release)
    _no_traceback(out)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "champion" in out.stderr and "model.onnx" in out.stderr and "--override quality --reason" in out.stderr
    assert d.state().serving == 2
    command = next(c for c in _fixes(d, "served version 2") if c[1] == "release")  # what status prints: as printed
    assert command[-4:-1] == ["--override", "quality", "--reason"] and "--eval-set" in command, command
    _run_as_printed(d, command)
    # the printed command releases the checkpoint's default configuration, which version 1 holds intact: served
    # again, the damaged version 2 dropped
    assert (d.state().serving, d.state().previous) == (1, None)
    history = d.cli("history")
    assert "override" in history.stdout and "damaged" in history.stdout, history.stdout[-3000:]
    # the override is the quality gate's verdict, as any override is: not a passed gate beside a history line
    events = [json.loads(line) for line in log_path(d.repo, NAME).read_text(encoding="utf-8").splitlines()]
    (override,) = [e for e in events if e.get("event") == "override"]
    assert override["gate"] == "quality" and "cannot re-score the champion" in override["verdict"], override
    quality = Workspace(Path(override["workspace"])).step("evaluate")["summary"]
    assert quality["overridden"] is True and "cannot re-score" in quality["override"]["verdict"], quality
    assert d.cli("sync").returncode == 0  # removes what is left of version 2 (no rollback target)
    d.assert_invariant(served=1)


def _fixes(d: Drill, marker: str) -> list[list[str]]:
    """``seqcls status`` reports a problem containing ``marker``: the commands it prints for it, as argv (the
    status lines the CLI prints, read in-process: the commands themselves run through the CLI)."""
    reports = status(d.settings)
    printed = [line for r in reports for line in r.lines()]
    lines = [line for line in printed if line.strip().startswith("✗") and marker in line]
    assert lines and not all(r.agree for r in reports), f"no problem with {marker!r}:\n" + "\n".join(printed)
    commands = [shlex.split(c) for line in lines for c in re.findall(r"`(seqcls [^`]+)`", line)]
    assert commands, f"no command printed for {marker!r}: {lines}"
    return list({shlex.join(c): c for c in commands}.values())


def _run_as_printed(d: Drill, command: list[str]) -> None:
    assert command[0] == "seqcls", command
    out = d.cli(*command[1:])
    _no_traceback(out)
    assert out.returncode == 0, (
        f"`{shlex.join(command)}` as printed exited {out.returncode}:\n" + out.stdout[-2000:] + out.stderr[-3000:]
    )


def _status_agrees(d: Drill) -> None:
    reports = status(d.settings)
    assert all(r.agree for r in reports), "\n".join(line for r in reports for line in r.lines())


@drill_test
def test_every_fix_command_status_prints_works_as_printed(
    drill: Drill, tiny_checkpoint_src: Path, tiny_checkpoint_b_src: Path
) -> None:
    import tritonclient.grpc as grpcclient
    from mlflow.tracking import MlflowClient

    d, names = drill, NAME.names
    d.release(tiny_checkpoint_b_src)
    d.release(tiny_checkpoint_src)
    assert (d.state().serving, d.state().previous) == (2, 1)

    # an endpoint that lost a model (a restart, a missed switch), MLflow's champion moved by hand, a candidate
    # whose release is gone: each is fixed by `seqcls sync`
    triton = grpcclient.InferenceServerClient(url=d.server.config.grpc_url)
    triton.unload_model(names.ensemble, headers=d.server.control_headers())
    MlflowClient(d.settings.mlflow_tracking_uri).set_registered_model_alias(NAME, "champion", "1")
    s = read_state(d.repo, NAME)
    killed = s.with_candidate(1, s.fingerprint_of(1), "a release killed -9")
    write_state(d.repo, killed, expected_generation=s.generation)
    commands = [c for marker in ("endpoint", "MLflow champion is", "has no live release") for c in _fixes(d, marker)]
    assert {shlex.join(c) for c in commands} == {"seqcls sync"}, commands
    _run_as_printed(d, commands[0])
    _status_agrees(d)

    # an unreadable state file, then a lost one: `seqcls sync --model-name seqcls` records it again
    state_path(d.repo, NAME).write_bytes(b"\xff\xfe garbage")
    (command,) = _fixes(d, "is unreadable")
    _run_as_printed(d, command)
    _status_agrees(d)
    state_path(d.repo, NAME).unlink()
    (command,) = _fixes(d, "is missing")
    _run_as_printed(d, command)
    _status_agrees(d)

    # an unreadable lease: `seqcls lease break --model-name seqcls`
    (d.repo / ".seqcls-lease.seqcls.json").write_bytes(b"\xff\xfe garbage")
    commands = _fixes(d, "lease")
    assert ["seqcls", "lease", "break", "--model-name", NAME] in commands, commands
    _run_as_printed(d, ["seqcls", "lease", "break", "--model-name", NAME])
    _status_agrees(d)

    # the served version partly deleted: `seqcls sync --model-name seqcls` restores it
    (d.repo / names.model / "2" / "model.onnx").unlink()
    (command,) = _fixes(d, "served version 2")
    assert command[1] == "sync", command
    _run_as_printed(d, command)
    _status_agrees(d)

    # the previous version gone and nothing records it: `seqcls release --checkpoint …` republishes it
    shutil.rmtree(d.repo / names.model / "1")
    (d.repo / ".seqcls-pins.seqcls.v1.json").unlink()
    (command,) = _fixes(d, "previous version 1")
    assert command[1] == "release" and str(tiny_checkpoint_b_src) in command, command
    _run_as_printed(d, command)
    _status_agrees(d)
    assert (d.state().serving, d.state().previous) == (3, 2)

    # the served version gone and nothing records it: the first fix releases it again, the second rolls back
    shutil.rmtree(d.repo / names.model / "3")
    (d.repo / ".seqcls-pins.seqcls.v3.json").unlink()
    release, rollback = _fixes(d, "served version 3")
    assert release[1] == "release" and rollback[1] == "rollback", (release, rollback)
    _run_as_printed(d, rollback)
    _status_agrees(d)
    assert d.state().serving == 2

    # no MLflow version holds the served one any more: release it again
    MlflowClient(d.settings.mlflow_tracking_uri).delete_model_version(NAME, "2")
    (command,) = _fixes(d, "no MLflow version")
    _run_as_printed(d, command)
    _status_agrees(d)

    # a served version without verdicts (put live by a path that skipped the gates): release it through them
    version = d.state().serving
    path = d.repo / names.ensemble / str(version) / "release.json"
    info = json.loads(path.read_text(encoding="utf-8"))
    info.pop("verdicts")
    path.write_text(json.dumps(info, indent=1, ensure_ascii=False), encoding="utf-8")
    write_pin(d.repo, names, version, {m: d.repo / m / str(version) for m in names.models})
    command = _fixes(d, "without passed or overridden verdicts")[0]
    _run_as_printed(d, command)
    _status_agrees(d)

    # the endpoint down: start it, then `seqcls sync` (the local server: `seqcls triton start` does both)
    d.server.stop()
    commands = _fixes(d, "endpoint")
    assert [c[1:3] for c in commands] == [["sync"], ["triton", "start"]], commands
    try:
        _run_as_printed(d, commands[1])  # the local server: started, and synced
        _status_agrees(d)
        _run_as_printed(d, commands[0])
    finally:
        assert d.cli("triton", "stop").returncode == 0
        d.server.start()
    assert d.cli("sync").returncode == 0
    d.assert_invariant()


# ---------------------------------------------------------------------------- pins and restore, on disk only


def _published(root: Path, workspace: Path) -> Repository:
    """Version 1 of ``alpha`` as publish leaves it (release.json per model, its pin), shipped from ``workspace``."""
    names = ModelName("alpha").names
    workspace.mkdir(parents=True)
    (workspace / "model.onnx").write_bytes(b"graph bytes " * 40_000)  # above what a pin keeps
    for model in names.models:
        vdir = root / model / "1"
        vdir.mkdir(parents=True)
        (vdir / "config.snapshot.pbtxt").write_text(f'name: "{model}"\n')
        if model == names.model:
            shutil.copyfile(workspace / "model.onnx", vdir / "model.onnx")
        files = {p.name: sha256_file(p) for p in vdir.iterdir()}
        info = {"version": 1, "model": model, "model_name": "alpha", "workspace": str(workspace), "files": files}
        (vdir / "release.json").write_text(json.dumps(info), encoding="utf-8")
    write_pin(root, names, 1, {m: root / m / "1" for m in names.models})
    return Repository(root, root / "no-source", names)


def test_a_pinned_version_is_restored_byte_identically_and_a_changed_release_json_is_named(tmp_path: Path) -> None:
    repo = _published(tmp_path / "repo", tmp_path / "ws")
    files = {str(p): p.read_bytes() for p in sorted(repo.root.rglob("*")) if p.is_file()}
    shutil.rmtree(repo.root / repo.names.model / "1")
    (repo.root / repo.names.tokenizer / "1" / "release.json").write_text("{}")
    assert "alpha_tokenizer/1/release.json changed since publish" in repo.damaged_files(1)
    assert repo.problems(1) and restore.plan(repo, 1).complete
    done = restore.restore_version(repo, 1)
    assert done.restored and not done.missing
    assert {str(p): p.read_bytes() for p in sorted(repo.root.rglob("*")) if p.is_file()} == files
    assert repo.problems(1) == []
    # without its workspace the graph has no verified copy: nothing half-restored, the file named
    shutil.rmtree(tmp_path / "ws")
    shutil.rmtree(repo.root / repo.names.model / "1")
    done = restore.restore_version(repo, 1)
    assert not (repo.root / repo.names.model / "1").exists()
    assert any("alpha_model/1/model.onnx" in m for m in done.missing), done.missing
