#!/usr/bin/env python3
"""Run the seqcls_release DAG task by task with ``airflow tasks test``, checking each outcome.

    scripts/airflow-tasks-test.py --checkpoint DIR [--params '{"opset": 14}'] [--migrate]

DIR must be under the DAG's checkpoints root, as for any run (SEQCLS_CHECKPOINTS_ROOT, or the
default model's ``checkpoints_root`` in the models file).

Every task runs in order in its own ``airflow tasks test`` call (wrapped in a timeout), with the
params given as ``-t``. Two traps make a plain loop lie: ``tasks test`` passes no XCom between
calls (the DAG's tasks fall back to the ``checkpoint`` param, so they work alone), and it exits
0 even when the task failed. So after each call this script checks the outcome itself: the state
the task reported, and the step record in the release workspace's ``manifest.json`` (status
``ok``, confirmed by the task's own summary line in this call's output). It stops at the first
failure with the reason and the log file, exit 1. ``rollback`` runs last and must skip (no
serving step failed); after a failed publish/reload/smoke the script prints the command that
restores what Triton served, instead of acting on its own.

Airflow settings come from ``scripts/airflow-env.sh`` (your environment wins). The DAG must be in
the metadata DB, so the script runs ``airflow dags reserialize`` first (``--migrate``: also
``airflow db migrate``, for a fresh AIRFLOW_HOME).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "seqcls_release"
ENV_SCRIPT = ROOT / "scripts" / "airflow-env.sh"
STATE_RE = re.compile(r"Task instance state updated.*?new_state=(\w+)")
FAILED_RE = re.compile(r"Task failed with exception|\[(?:error|critical)\s*\] (?:Task failed|Unhandled exception)")

sys.path.insert(0, str(ROOT / "plugins"))  # seqcls, also when the package is not installed


def airflow_env() -> dict[str, str]:
    """The environment after sourcing scripts/airflow-env.sh (caller's values win there)."""
    out = subprocess.run(
        ["bash", "-c", f'source "{ENV_SCRIPT}" && env -0'],
        capture_output=True,
        check=True,
        timeout=30,
        env=os.environ.copy(),
    ).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


def run(cmd: list[str], env: dict[str, str], log_path: Path, timeout: float) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group, output to ``log_path``; (exit code or None on timeout, output)."""
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = None
    return code, log_path.read_text(encoding="utf-8", errors="replace")


def tail(text: str, n: int = 25) -> str:
    return "\n".join("    " + line[:300] for line in text.splitlines()[-n:])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="checkpoint directory (or 'latest')")
    ap.add_argument("--params", default="{}", help="more DAG params as a JSON object")
    ap.add_argument("--date", default=None, help="logical date (default: now, UTC)")
    ap.add_argument("--task-timeout", type=float, default=1800.0, help="seconds per task (default 1800)")
    ap.add_argument("--migrate", action="store_true", help="run `airflow db migrate` first")
    ap.add_argument("--logs", type=Path, default=None, help="directory for per-task logs (default: a temp dir)")
    return ap.parse_args(argv)


def open_workspace(args: argparse.Namespace, params: dict):
    """The release the tasks will use, found the same way the tasks find it (bad input fails here): under
    the DAG's checkpoints root (its model's in the models file, else SEQCLS_CHECKPOINTS_ROOT)."""
    from seqcls.airflow.context import config_from_params, settings_from_params
    from seqcls.airflow.models_file import release_models
    from seqcls.airflow.roots import locate_checkpoint
    from seqcls.release.intake import open_release

    spec = next((s for s in release_models(ROOT / "dags") if s.dag_id == DAG_ID), None)
    settings = settings_from_params(params, checkpoints_root=spec.checkpoints_root if spec else "")
    checkpoint = locate_checkpoint(args.checkpoint, settings)
    return checkpoint, open_release(checkpoint, config_from_params(params), settings)


def set_up_airflow(airflow: str, env: dict[str, str], logs: Path, migrate: bool) -> bool:
    setup = [[airflow, "dags", "reserialize"]]
    if migrate:
        setup.insert(0, [airflow, "db", "migrate"])
    for cmd in setup:
        code, out = run(cmd, env, logs / f"{cmd[1]}-{cmd[2]}.log", 600)
        if code != 0:
            print(f"FAILED: {' '.join(cmd[1:])} exited {code}\n{tail(out)}", file=sys.stderr)
            return False
    return True


def task_problem(task_id: str, code: int | None, out: str, ws, timeout: float) -> tuple[str, str | None]:
    """(the state the task reported, what went wrong or None) for one ``airflow tasks test`` call."""
    from seqcls.airflow.context import ROLLBACK_TASK, TASK_STEPS

    step = TASK_STEPS.get(task_id)
    states = STATE_RE.findall(out)
    state = states[-1] if states else "unknown"
    if code is None:
        return state, f"timed out after {timeout:.0f}s"
    if code != 0:
        return state, f"`airflow tasks test` exited {code}"
    if FAILED_RE.search(out) or state == "failed":
        return state, "the task failed (airflow tasks test exits 0 anyway)"
    if task_id == ROLLBACK_TASK:
        ok = state == "skipped"
        return state, None if ok else f"rollback should have skipped (no serving step failed) but ended {state}"
    if state != "success":
        return state, f"the task ended {state}"
    if step is not None:
        rec = ws.step(step) or {}
        if rec.get("status") != "ok":
            return state, f"manifest step {step!r} is {rec.get('status') or 'missing'}: {rec.get('error', '')[:300]}"
        if not re.search(rf"\b{step}: (ok|skipped) in ", out):
            return state, f"no '{step}: ok/skipped' summary line in this call's output (stale manifest?)"
    return state, None


def report_failure(task_id: str, problem: str, seconds: float, log_path: Path, out: str, checkpoint, release) -> None:
    from seqcls.airflow.context import ROLLBACK_ON, TASK_STEPS

    step = TASK_STEPS.get(task_id)
    rec = release.workspace.step(step) if step else None
    print(f"✗ {task_id} ({seconds:.1f}s): {problem}", file=sys.stderr)
    if rec and rec.get("error"):
        print(f"  manifest: {step} {rec.get('status')} — {rec['error'][:500]}", file=sys.stderr)
    print(f"  log: {log_path}\n{tail(out)}", file=sys.stderr)
    if task_id in ROLLBACK_ON:
        print(
            "  to serve what Triton served before (the DAG's rollback task does this in a real run):\n"
            f"    seqcls rollback --checkpoint {checkpoint} --model-name {release.config.model_name}",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from seqcls.airflow.context import TASK_ORDER, TASK_STEPS
    from seqcls.errors import SeqclsError

    try:
        extra = json.loads(args.params)
    except ValueError as exc:
        print(f"--params is not JSON: {exc}", file=sys.stderr)
        return 2
    params = {"skip_if_champion": False, **extra, "checkpoint": args.checkpoint}
    env = airflow_env()
    airflow = str(Path(sys.executable).with_name("airflow"))
    if not Path(airflow).exists():
        airflow = "airflow"
    date = args.date or datetime.now(UTC).replace(microsecond=0).isoformat()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="seqcls-tasks-test-"))
    logs.mkdir(parents=True, exist_ok=True)
    try:
        checkpoint, release = open_workspace(args, params)
    except SeqclsError as exc:
        print(f"FAILED before any task: {exc}", file=sys.stderr)
        return 1
    ws = release.workspace
    params["checkpoint"] = str(checkpoint)
    print(f"seqcls_release task by task: checkpoint {checkpoint}\n  workspace {ws.root}\n  logs {logs}")
    if not set_up_airflow(airflow, env, logs, args.migrate):
        return 1

    t_all = time.perf_counter()
    for index, task_id in enumerate(TASK_ORDER):
        cmd = [airflow, "tasks", "test", DAG_ID, task_id, date, "-t", json.dumps(params, ensure_ascii=False)]
        t0 = time.perf_counter()
        log_path = logs / f"{index:02d}-{task_id}.log"
        code, out = run(cmd, env, log_path, args.task_timeout)
        seconds = time.perf_counter() - t0
        state, problem = task_problem(task_id, code, out, ws, args.task_timeout)
        if problem:
            report_failure(task_id, problem, seconds, log_path, out, checkpoint, release)
            return 1
        step = TASK_STEPS.get(task_id)
        detail = f" — {(ws.step(step) or {}).get('message', '')}" if step else ""
        print(f"✓ {task_id} {state} in {seconds:.1f}s{detail}")
    print(f"all {len(TASK_ORDER)} tasks passed in {time.perf_counter() - t_all:.0f}s; workspace {ws.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
