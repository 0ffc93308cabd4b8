"""The per-model release lease, with real competing OS processes."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from seqcls.contract.names import ModelName
from seqcls.serving.lease import LeaseError, LeaseHolder, ReleaseLease

NAME = ModelName("seqcls")

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from seqcls.serving.lease import LeaseError, ReleaseLease
    from seqcls.contract.names import ModelName
    repo, owner, kind, timeout, ttl, done = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), \\
        float(sys.argv[5]), Path(sys.argv[6])
    lease = ReleaseLease(Path(repo), ModelName("seqcls"))
    try:
        h = lease.acquire(owner, kind=kind, run="run-" + owner, step="publish", timeout=timeout, ttl=ttl, poll=0.05)
    except LeaseError as exc:
        print("LOST", exc, flush=True)
        sys.exit(3)
    print("WON", h.pid, flush=True)
    deadline = time.monotonic() + 8
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if kind == "process":
        lease.release(owner)
    """
)


def _spawn(repo: Path, owner: str, *, kind: str = "process", timeout: float = 1.5, ttl: float = 60.0,
           done: Path | None = None) -> subprocess.Popen[str]:  # fmt: skip
    done = done or repo.parent / "done"
    args = [sys.executable, "-c", HOLDER, str(repo), owner, kind, str(timeout), str(ttl), str(done)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_processes_race_exactly_one_wins(tmp_path: Path) -> None:
    repo, done = tmp_path / "repo", tmp_path / "done"
    procs = [_spawn(repo, f"p{i}", timeout=2.0, done=done) for i in range(2)]
    deadline = time.monotonic() + 8
    loser = None
    while loser is None and time.monotonic() < deadline:  # the loser gives up after its 2 s timeout
        for i, p in enumerate(procs):
            if p.poll() is not None:
                loser = i
        time.sleep(0.05)
    assert loser is not None, "nobody timed out: both hold the lease?"
    done.touch()
    outs = [p.communicate(timeout=10) for p in procs]
    winner = 1 - loser
    assert procs[winner].returncode == 0 and outs[winner][0].startswith("WON"), outs[winner]
    assert procs[loser].returncode == 3, outs[loser]
    msg = outs[loser][0]
    win_pid = outs[winner][0].split()[1]
    assert msg.startswith("LOST")
    for part in (f"host {socket.gethostname()}", f"pid {win_pid}", f"run run-p{winner}", "since ", "step publish",
                 "seqcls lease break --model-name seqcls"):  # fmt: skip
        assert part in msg, (part, msg)
    assert ReleaseLease(repo, NAME).holder() is None, "the winner released on exit"


def test_sigkilled_holder_is_recovered_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = tmp_path / "repo"
    proc = _spawn(repo, "victim", ttl=600)
    assert proc.stdout is not None and proc.stdout.readline().startswith("WON")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    lease = ReleaseLease(repo, NAME)
    assert lease.holder() is not None and lease.holder().owner == "victim"
    caplog.set_level(logging.WARNING, logger="seqcls.serving.lease")
    t0 = time.monotonic()
    h = lease.acquire("next", kind="process", step="publish", timeout=0, ttl=60)
    assert time.monotonic() - t0 < 1 and h.owner == "next" and h.pid == os.getpid()
    assert any("dead holder" in r.message and "victim" in r.message and str(proc.pid) in r.message
               for r in caplog.records)  # fmt: skip
    proc.communicate()


def test_run_lease_survives_its_process_until_ttl(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = tmp_path / "repo"
    (tmp_path / "done").touch()  # the task process takes the lease and exits, like an Airflow task
    proc = _spawn(repo, "dagrun-1", kind="run", ttl=1.0)
    _out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    lease = ReleaseLease(repo, NAME)
    with pytest.raises(LeaseError, match="run run-dagrun-1"):
        lease.acquire("other", timeout=0.2, poll=0.05)
    again = lease.acquire("dagrun-1", kind="run", step="smoke", timeout=0, ttl=0.3)  # the run's next task
    assert again.step == "smoke" and again.run == "run-dagrun-1"
    time.sleep(0.5)
    caplog.set_level(logging.WARNING, logger="seqcls.serving.lease")
    h = lease.acquire("other", timeout=0)
    assert h.owner == "other"
    assert any("dead holder" in r.message and "ttl" in r.message for r in caplog.records)


def test_process_lease_on_another_host_only_expires_by_ttl(tmp_path: Path) -> None:
    lease = ReleaseLease(tmp_path, NAME)
    now = time.time()
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + "Z"  # noqa: E731
    far = LeaseHolder("cli:elsewhere:4242", "process", "elsewhere", 999999, None, iso(now), iso(now), 60.0, "reload")
    lease._write(far)
    with pytest.raises(LeaseError, match="host elsewhere, pid 999999"):
        lease.acquire("me", timeout=0)
    lease._write(LeaseHolder(**{**far.to_dict(), "renewed_at": iso(now - 120)}))
    assert lease.acquire("me", timeout=0).owner == "me"


def test_reentrant_renew_release_and_break(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lease = ReleaseLease(tmp_path, NAME)
    h1 = lease.acquire("a", kind="run", run="r1", step="publish", timeout=0)
    time.sleep(0.01)
    h2 = lease.acquire("a", kind="run", run="r1", step="reload", timeout=0)
    assert h2.since == h1.since and h2.step == "reload" and h2.renewed_at >= h1.renewed_at
    assert lease.renew("a", "smoke").step == "smoke"
    with pytest.raises(LeaseError, match="lost the release lease"):
        lease.renew("b")
    caplog.set_level(logging.WARNING, logger="seqcls.serving.lease")
    assert lease.release("b") is False
    assert lease.holder() is not None and lease.holder().owner == "a"
    assert any("tried to release" in r.message for r in caplog.records)
    broken = lease.break_lease("operator", "host died")
    assert broken is not None and broken.owner == "a" and lease.holder() is None
    assert lease.release("a") is False and lease.break_lease("operator", "again") is None
    lease.acquire("a", timeout=0)
    assert lease.release("a") is True and lease.holder() is None
    assert not [p for p in tmp_path.iterdir() if p.is_dir()], "Triton would list a directory as a model"


def test_hold_renews_while_held(tmp_path: Path) -> None:
    lease = ReleaseLease(tmp_path, NAME)
    with lease.hold(step="release", ttl=0.3, timeout=0) as h:
        time.sleep(0.8)  # longer than the ttl: the heartbeat keeps it
        assert lease.dead_reason(lease.holder()) is None
        with pytest.raises(LeaseError):
            lease.acquire("someone-else", timeout=0)
        assert lease.holder().owner == h.owner
    assert lease.holder() is None


def test_corrupt_lease_record_is_explained_and_breakable(tmp_path: Path) -> None:
    lease = ReleaseLease(tmp_path, NAME)
    lease.path.write_text("{not json")
    with pytest.raises(LeaseError, match=r"unreadable.*seqcls lease break"):
        lease.acquire("a", timeout=0)
    lease.break_lease("operator", "corrupt")
    assert lease.acquire("a", timeout=0).owner == "a"
