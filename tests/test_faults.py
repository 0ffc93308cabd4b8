"""The test-only fault seam: dies, fails or fills the disk exactly at the named point."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from seqcls import faults

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from seqcls import faults
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    faults.point("step:before:publish")
    print("passed step:before:publish", flush=True)
    faults.point("reload:after-composing")
    print("survived reload:after-composing", flush=True)
    """
)


def _run(plan: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SEQCLS_FAULT_PLAN"}
    if plan is not None:
        env["SEQCLS_FAULT_PLAN"] = plan
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)


def test_die_kills_with_sigkill_at_that_point_only() -> None:
    proc = _run("die@reload:after-composing")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "passed step:before:publish" in proc.stdout
    assert "survived" not in proc.stdout
    assert "CRITICAL" in proc.stderr and "reload:after-composing" in proc.stderr


def test_unset_or_other_point_is_a_no_op() -> None:
    for plan in (None, "", "die@publish:copy"):
        proc = _run(plan)
        assert proc.returncode == 0, proc.stderr
        assert "survived reload:after-composing" in proc.stdout


def test_enospc_and_fail_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQCLS_FAULT_PLAN", "enospc@publish:copy, fail@reload:after-composing")
    with pytest.raises(OSError) as info:
        faults.point("publish:copy")
    assert info.value.errno == errno.ENOSPC and "SEQCLS_FAULT_PLAN at publish:copy" in str(info.value)
    with pytest.raises(RuntimeError, match="reload:after-composing"):
        faults.point("reload:after-composing")
    faults.point("publish:model-written:tokenizer")  # not in the plan


def test_unset_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEQCLS_FAULT_PLAN", raising=False)
    faults.point("step:before:publish")


@pytest.mark.parametrize("name", ["", "publish", "Publish:copy", "publish:", "publish copy", "publish:a b"])
def test_bad_point_name_is_refused(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEQCLS_FAULT_PLAN", raising=False)
    with pytest.raises(ValueError, match="not a valid name"):
        faults.point(name)


@pytest.mark.parametrize("plan", ["explode@publish:copy", "die", "die@nocolon"])
def test_bad_plan_is_refused(plan: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQCLS_FAULT_PLAN", plan)
    with pytest.raises(ValueError):
        faults.point("publish:copy")


def test_stall_sleeps_at_that_point_until_killed() -> None:
    import time

    env = {k: v for k, v in os.environ.items() if k != "SEQCLS_FAULT_PLAN"}
    env["SEQCLS_FAULT_PLAN"] = "stall@reload:after-composing"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        line = proc.stdout.readline()  # the point before passes
        assert line.strip() == "passed step:before:publish"
        time.sleep(2)
        assert proc.poll() is None, "a stall must not return"
    finally:
        proc.kill()
        out, err = proc.communicate(timeout=30)
    assert time.monotonic() < deadline
    assert "stalls for 600s" in err and "reload:after-composing" in err, err
    assert "survived" not in out


def test_pause_stops_at_that_point_until_sigcont(tmp_path) -> None:
    """``pause@`` freezes the process exactly there (SIGSTOP); SIGCONT lets it carry on. The plan is read from
    a file (``@path``) at every point, so a drill can plant it while a worker keeps its environment."""
    import time

    import psutil

    plan = tmp_path / "plan"
    env = {k: v for k, v in os.environ.items() if k != "SEQCLS_FAULT_PLAN"}
    env["SEQCLS_FAULT_PLAN"] = f"@{plan}"
    script = SCRIPT.replace(
        'print("passed', 'open(sys.argv[1], "w").write("pause@reload:after-composing\\n")\nprint("passed'
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(plan)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "passed step:before:publish"  # no plan file yet: no fault
        deadline = time.monotonic() + 30
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline and proc.poll() is None, "the process did not pause"
            time.sleep(0.1)
        time.sleep(0.5)
        assert psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "survived reload:after-composing" in out
    assert f"fault: process {proc.pid} pauses until SIGCONT" in err and "continues after reload:after-composing" in err


def test_a_plan_file_that_does_not_exist_is_no_plan(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQCLS_FAULT_PLAN", f"@{tmp_path / 'absent'}")
    faults.point("publish:copy")
    (tmp_path / "absent").write_text("fail@publish:copy\nenospc@reload:after-composing\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="publish:copy"):
        faults.point("publish:copy")
    with pytest.raises(OSError):
        faults.point("reload:after-composing")
