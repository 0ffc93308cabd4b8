"""The Airflow UI test's Ctrl-C stop tells Airflow's own shutdown hang from a hang of ours.

Airflow 3.3.2's scheduler can hang on Ctrl-C in ``LocalExecutor.end()``, joining an executor worker that sits
idle (apache/airflow#67870; a fresh-clone CI run saw it ignore the second SIGINT too). The UI test accepts
that hang only in that shape — the scheduler, having logged the executor's shutdown, over idle executor
workers and nothing else — and reports it as a warning with each process's wait channels; anything else
left running under a component that ignores two SIGINTs fails it. Here a stand-in scheduler (a real process
tree with a forked worker that ignores SIGINT, as LocalExecutor's does) hangs three ways.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.airflow import LOCAL_EXECUTOR_WORKER, hung_in_local_executor_end, stop_components

#: A scheduler that hangs on SIGINT joining its forked worker (titled as given), as LocalExecutor.end() does,
#: and logs a "stack dump" on SIGUSR2 as the real scheduler's handler does.
_SCHEDULER = """
import multiprocessing, signal, sys, time
from setproctitle import setproctitle

def worker():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setproctitle(sys.argv[1])
    time.sleep(600)

if __name__ == "__main__":
    multiprocessing.set_start_method("fork")
    child = multiprocessing.Process(target=worker)
    child.start()

    def end(*_):
        print("Shutting down LocalExecutor; waiting for running tasks to finish.", flush=True)
        child.join()

    signal.signal(signal.SIGINT, end)
    signal.signal(signal.SIGUSR2, lambda *_: print("stack dump", flush=True))
    print("ready", flush=True)
    while True:
        time.sleep(1)
"""


def _hung_scheduler(tmp_path: Path, worker_title: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "scheduler.log"
    script = tmp_path / "scheduler.py"
    script.write_text(_SCHEDULER)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), worker_title], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children()
        if "ready" in log.read_text() and children and worker_title in " ".join(children[0].cmdline()):
            return proc, log
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the stand-in scheduler did not start: {log.read_text()}")


@pytest.mark.parametrize(
    ("worker_title", "upstream"),
    [
        (f"{LOCAL_EXECUTOR_WORKER}: <idle>", True),
        (f"{LOCAL_EXECUTOR_WORKER}: seqcls_release.smoke_test manual__2026", False),  # a task still running
        ("python -m seqcls.some_helper", False),  # something else under the scheduler
    ],
    ids=["idle-executor-worker", "a-task-running", "another-process"],
)
def test_a_scheduler_that_ignores_two_sigints_is_reported_and_told_apart(
    tmp_path: Path, worker_title: str, upstream: bool
) -> None:
    proc, log = _hung_scheduler(tmp_path, worker_title)
    tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]

    codes, stuck = stop_components({"scheduler": proc}, timeout=2)

    assert codes == {"scheduler": None, "leftover_processes": 0}  # killed after the second SIGINT, nothing left
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in tree)
    report = stuck["scheduler"]
    assert len(report) == 2 and worker_title in report[1], report
    assert all(" threads: " in line for line in report), report  # each process's wait channels, for the CI log
    text = log.read_text()
    assert "stack dump" in text  # SIGUSR2 before the second signal: the real scheduler logs every thread's stack
    assert hung_in_local_executor_end(report, text) is upstream
    assert not hung_in_local_executor_end(report, "")  # not the upstream hang unless end() said it was shutting down


def test_a_component_that_exits_on_the_first_sigint_is_not_reported(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    time.sleep(0.5)
    codes, stuck = stop_components({"api-server": proc}, timeout=5)
    assert codes["api-server"] != 0 and codes["api-server"] is not None  # KeyboardInterrupt: exits at once
    assert stuck == {} and codes["leftover_processes"] == 0
