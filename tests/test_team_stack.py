"""Scheduled retraining on the team stack, run for real: the compose file's services as local processes.

One stack for the module (``seqcls_tools.teamstack.TeamStack``): PostgreSQL (Airflow's metadata and
MLflow's store), the ``mlflow server`` with basic auth and proxied artifacts, Redis, three local
Tritons on one repository with Prometheus scraping them (the project's rules), and Airflow 3 with the
compose file's **CeleryExecutor and two Celery workers**, each in a working directory of its own,
sharing only what the compose volumes stand for (SEQCLS_HOME, the Triton repository, the checkpoints
root, the task logs).

Two models at once, from a models file: ``seqcls`` on a daily cron (its intervals run by the real
scheduler as one-day backfills) and ``beta`` on its checkpoints Asset (a training stand-in drops a
marked checkpoint and posts the Asset event over Airflow's REST API). Ten intervals: a good retrain is
promoted, a worse one refused by the quality gate, an unchanged one skipped as champion, a broken one
(vocab) refused at parity, then six daily retrains promoted one after the other, gc collecting after each
promote (``SEQCLS_GC_MIN_AGE=0``: the stack's minutes stand for days) — for both models, with the
notifications received, and ``seqcls history`` telling the same story as Airflow's run list. Served ==
recorded == champion at the end, and the releases' heavy artifacts and Triton versions bounded by the policy.

Then the drills, on the same stack, each through a fault plan the workers read from a file
(``SEQCLS_FAULT_PLAN=@path``, :mod:`seqcls.faults`): a Celery worker kill -9'd during ``reload_triton``;
two runs of one model at once, the first meeting a PostgreSQL restart during ``register_model``, a
scheduler kill -9 during ``smoke_test`` and the MLflow server kill -9'd during ``promote``. Each ends with
served == recorded == champion and the same answers after a Triton restart and one sync.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from seqcls.release.completion import mark_complete
from tests.helpers.demo_models import demo_eval_file, quick_demo_model, worse_retrain
from tests.helpers.receivers import JsonReceiver

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: The release DAG's daily cron hour: the one farthest from now, so the module never meets the scheduler's next
#: interval. On ``@daily`` a run crossing midnight UTC got a scheduled run of its own mid-test (seen in CI).
HOUR = (datetime.now(UTC).hour + 12) % 24
MODELS = {"seqcls": f"'0 {HOUR} * * *'", "beta": "asset"}
DAG_IDS = {"seqcls": "seqcls_release", "beta": "seqcls_release__beta"}
#: interval → (what training produced, the outcome the release must end with)
PLAN = [
    ("good", "promoted"),
    ("worse", "refused"),
    ("unchanged", "skipped"),
    ("broken-vocab", "refused"),
    *[("retrain", "promoted")] * 6,  # daily retrains, each another fingerprint: gc after every promote collects
]
#: Triton (and MLflow) version each promoted interval becomes: refused and skipped releases publish nothing.
PROMOTED = {i: n for n, i in enumerate((i for i, (_, e) in enumerate(PLAN, 1) if e == "promoted"), 1)}
FIRST_DAY = datetime(2026, 11, 1, tzinfo=UTC)
RUN_TIMEOUT = 420
TRITONS = 3
HEARTBEAT_TIMEOUT = 30


def _models_file(path: Path, notify_url: str) -> Path:
    lines = ["models:"]
    for name, schedule in MODELS.items():
        lines += [
            f"  - name: {name}",
            f"    schedule: {schedule}",
            f"    checkpoints_root: {name}",
            "    eval_set: eval.txt",
            f"    notify: ['{notify_url}']",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _broken_vocab(good: Path, out: Path) -> Path:
    shutil.copytree(good, out)
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[vocab.index("公")] = "公 "  # the serving tokenizer trims it: the parity gate refuses
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("team-trained")
    good = quick_demo_model(tmp_path_factory).path
    return {
        "good": good,
        "worse": worse_retrain(good, root / "worse"),
        "unchanged": good,
        "broken-vocab": _broken_vocab(good, root / "broken"),
    }


@pytest.fixture(scope="module")
def receiver():
    r = JsonReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def team_stack(tmp_path_factory: pytest.TempPathFactory, receiver: JsonReceiver):
    from seqcls_tools.teamstack import TeamStack

    root = tmp_path_factory.mktemp("team-stack")
    models_file = _models_file(root / "seqcls-models.yaml", receiver.url())
    t0 = time.perf_counter()
    # a killed worker's task is failed by the scheduler once its heartbeats stop: 30 s here (default 300 s)
    drills = {
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        # the drills' fault plan, read at every fault point: planted and cleared while the workers run
        "SEQCLS_FAULT_PLAN": f"@{root / 'fault-plan'}",
        # gc after each promote collects what the retention policy lets go at once (else only after an hour)
        "SEQCLS_GC_MIN_AGE": "0",
    }
    stack = TeamStack(
        root, models_file=models_file, password="team-stack-test", airflow_env=drills, tritons=TRITONS, prometheus=True
    )
    stack.start()
    print(f"\nteam stack up in {time.perf_counter() - t0:.0f}s")
    try:
        yield stack
    finally:
        t1 = time.perf_counter()
        stack.stop()
        print(f"team stack stopped in {time.perf_counter() - t1:.0f}s")


def _api(stack, method: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
    """``stack.api`` with Airflow's answer in the failure (a 409's reason is in its body)."""
    import urllib.error

    try:
        return stack.api(method, path, body, token=token)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{method} {path} {body}: {exc.code} {exc.read().decode(errors='replace')}") from None


@pytest.fixture(autouse=True)
def no_run_left_over(request: pytest.FixtureRequest) -> None:
    """Before each test on the module's stack: fail any run an earlier test left queued or running (it failed or
    timed out mid-run) and cancel its backfill. Left alone, it holds its DAG's one active run and the two workers,
    and every later test fails waiting for its own runs (seen in CI): one failure stays one failure."""
    if "team_stack" not in request.fixturenames:
        return
    stack = request.getfixturevalue("team_stack").airflow.stack
    token = stack.token()
    left = []
    for dag_id in DAG_IDS.values():
        for b in _api(stack, "GET", f"/api/v2/backfills?dag_id={dag_id}", token=token)["backfills"]:
            if not b["completed_at"]:
                _api(stack, "PUT", f"/api/v2/backfills/{b['id']}/cancel", token=token)
                left.append(f"backfill {b['id']}")
        for state in ("queued", "running"):
            runs = _api(stack, "GET", f"/api/v2/dags/{dag_id}/dagRuns?state={state}", token=token)["dag_runs"]
            for r in runs:
                path = f"/api/v2/dags/{dag_id}/dagRuns/{r['dag_run_id']}"
                _api(stack, "PATCH", path, {"state": "failed"}, token=token)
                left.append(f"{dag_id} {r['dag_run_id']} ({state})")
    if left:
        print(f"\nfailed what an earlier test left running: {left}")
        _wait(
            lambda: (
                not _api(stack, "GET", "/api/v2/dags/~/dagRuns/~/taskInstances?state=running", token=token)[
                    "total_entries"
                ]
            ),
            120,
            "no task instance running",
        )


def _wait(predicate, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _drop(stack, model: str, interval: int, kind: str, trained: dict[str, Path]) -> Path:
    """The training stand-in: a new checkpoint directory under the model's root, marked complete (a retrain:
    the good model nudged by an amount of its own, so another fingerprint every day)."""
    target = stack.settings.checkpoints_root / model / f"{interval}-{kind}"
    if kind == "retrain":
        _nudged(trained["good"], target, delta=-1e-4 * interval)  # the drills nudge upwards
    else:
        shutil.copytree(trained[kind], target)
    mark_complete(target, run=f"train-{model}-{interval}")
    return target


def _seqcls(stack, *args: str) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, **stack.cli_env()}
    return subprocess.run(
        [str(Path(sys.executable).parent / "seqcls"), *args], env=env, capture_output=True, text=True, timeout=120
    )


#: What the day-to-day commands cost and what the releases hold on disk, after the first interval and after the
#: module's last release (``_costs``): the same figures as the growth benchmark, through the real scheduler.
COSTS: dict[str, dict] = {}


def _costs(team_stack, when: str, model: str = "beta") -> dict:
    """Wall time of ``status``, ``history --limit 20`` and ``gc --dry-run`` (each a fresh CLI, as a user runs them)
    and the model's disk by kind; ``gc --dry-run`` must plan over the PostgreSQL-backed registry."""
    out: dict = {"seconds": {}}
    for name, args in (
        ("status", ("status", "--model-name", model, "--json")),
        ("history", ("history", "--model-name", model, "--limit", "20", "--json")),
        ("gc", ("gc", "--model-name", model, "--dry-run", "--json")),
    ):
        t0 = time.perf_counter()
        done = _seqcls(team_stack, *args)
        out["seconds"][name] = round(time.perf_counter() - t0, 2)
        assert done.returncode == 0, done.stdout + done.stderr
        if name == "status":
            out["disk"] = json.loads(done.stdout)[0].get("disk", {})
    COSTS[when] = out
    return out


#: How long after a task recorded its end its Celery workload may still be running: the task process's own exit.
WORKLOAD_LAG_LIMIT = 3.0
_WORKLOAD_FINISHED = re.compile(r"^(\S+Z) \[info\s*\] Workload finished .*workload_id=([0-9a-f-]+)")


def _workload_lags(worker_logs: list[str], ended: dict[str, str]) -> dict[str, float]:
    """Per task instance: seconds from its end date to its Celery workload's "Workload finished" line — the time
    its worker still belonged to it. The supervisor notices its task's exit only at its next wake-up when the
    task closed its sockets before exiting, which is every task that tears down gRPC or Paddle threads."""
    lags = {}
    for text in worker_logs:
        for line in text.splitlines():
            m = _WORKLOAD_FINISHED.match(line)
            if m and m.group(2) in ended:
                finished = datetime.fromisoformat(m.group(1))
                lags[m.group(2)] = (finished - datetime.fromisoformat(ended[m.group(2)])).total_seconds()
    return lags


def _outcome(tis: dict[str, str]) -> str:
    """What a run did, from its task states (the same reading as the DAG's report_outcome)."""
    if tis.get("promote") == "success":
        return "promoted"
    if any(state == "failed" for state in tis.values()):
        return "refused"
    return "skipped"


#: Twenty DAG runs, each bounded by RUN_TIMEOUT: the suite's 900 s per test is a hang guard this test does not
#: need, and on two cores shared with the other test worker it took 781 s here (522 s alone), 900+ on a slower host.
@pytest.mark.timeout(1800)
def test_scheduled_retraining_two_models_on_celery_workers(team_stack, trained, receiver) -> None:
    stack = team_stack.airflow.stack
    token = stack.token()
    for model in MODELS:
        (team_stack.settings.checkpoints_root / model).mkdir(parents=True, exist_ok=True)
        demo_eval_file(team_stack.settings.checkpoints_root / model / "eval.txt")

    def parsed() -> bool:
        try:
            return all(_api(stack, "GET", f"/api/v2/dags/{d}", token=token) for d in DAG_IDS.values())
        except AssertionError:  # 404 until the dag-processor has parsed the file
            return False

    _wait(
        parsed,
        120,
        "both release DAGs parsed",
    )
    errors = _api(stack, "GET", "/api/v2/importErrors", token=token)
    assert errors["total_entries"] == 0, errors
    assets = _api(stack, "GET", "/api/v2/assets?uri_pattern=seqcls://checkpoints/beta", token=token)["assets"]
    (beta_asset,) = [a for a in assets if a["uri"] == "seqcls://checkpoints/beta"]
    # paused at creation (the compose file's setting); beta is unpaused for its Asset schedule
    _api(stack, "PATCH", f"/api/v2/dags/{DAG_IDS['beta']}", {"is_paused": False}, token=token)

    table = []
    ended: dict[str, str] = {}  # task instance id -> its end date, as the task recorded it
    for interval, (kind, expected) in enumerate(PLAN, start=1):
        t0 = time.perf_counter()
        day = FIRST_DAY + timedelta(days=interval - 2, hours=HOUR)  # that day's trigger time
        for model in MODELS:
            _drop(team_stack, model, interval, kind, trained)
        before = {
            model: {r["dag_run_id"] for r in _api(stack, "GET", f"/api/v2/dags/{d}/dagRuns", token=token)["dag_runs"]}
            for model, d in DAG_IDS.items()
        }
        if interval == 1:  # unpaused now: the scheduler runs the latest daily interval (catchup off)
            _api(stack, "PATCH", f"/api/v2/dags/{DAG_IDS['seqcls']}", {"is_paused": False}, token=token)
            backfill = {}
        else:  # the earlier intervals, one day each, run by the scheduler as a backfill
            backfill = _api(
                stack,
                "POST",
                "/api/v2/backfills",
                {
                    "dag_id": DAG_IDS["seqcls"],
                    "from_date": day.isoformat(),
                    "to_date": day.isoformat(),
                    "max_active_runs": 1,
                    "reprocess_behavior": "none",
                    "run_backwards": False,
                    "dag_run_conf": {},
                },
                token=token,
            )
        _api(stack, "POST", "/api/v2/assets/events", {"asset_id": beta_asset["id"], "extra": {"interval": interval}},
                  token=token)  # fmt: skip
        runs = {}
        for model, dag_id in DAG_IDS.items():

            def finished(dag_id=dag_id, known=before[model]):
                listed = _api(stack, "GET", f"/api/v2/dags/{dag_id}/dagRuns", token=token)["dag_runs"]
                new = [r for r in listed if r["dag_run_id"] not in known]
                return new[0] if new and new[0]["state"] in ("success", "failed") else None

            runs[model] = _wait(finished, RUN_TIMEOUT, f"{model}'s run of interval {interval}", interval=3)
        if backfill:  # the scheduler closes a backfill shortly after its last run: one backfill per DAG at a time
            _wait(
                lambda b=backfill["id"]: _api(stack, "GET", f"/api/v2/backfills/{b}", token=token)["completed_at"],
                60,
                f"backfill {backfill['id']} completed",
                interval=1,
            )
        seconds = time.perf_counter() - t0
        for model, run in runs.items():
            tis = _api(
                stack, "GET", f"/api/v2/dags/{DAG_IDS[model]}/dagRuns/{run['dag_run_id']}/taskInstances", token=token
            )["task_instances"]
            states = {t["task_id"]: t["state"] for t in tis}
            ended.update({t["id"]: t["end_date"] for t in tis if t["end_date"]})
            table.append(
                {
                    "interval": interval,
                    "model": model,
                    "checkpoint": kind,
                    "run": run["dag_run_id"],
                    "run_type": run["run_type"],
                    "state": run["state"],
                    "outcome": _outcome(states),
                    "expected": expected,
                    "seconds": round(seconds),
                    "states": states,
                }
            )
        print(f"interval {interval} ({kind}): {[(r['model'], r['outcome'], r['state']) for r in table[-2:]]} "
              f"in {seconds:.0f}s; backfill {backfill.get('id')}")  # fmt: skip
        if interval == 1:
            _costs(team_stack, "after the first release")

    print(json.dumps([{k: v for k, v in r.items() if k != "states"} for r in table], indent=1))
    wrong = [r for r in table if r["outcome"] != r["expected"]]
    assert not wrong, json.dumps(wrong, indent=1)
    assert [r["run_type"] for r in table if r["model"] == "seqcls"] == ["scheduled"] + ["backfill"] * (len(PLAN) - 1)
    assert {r["run_type"] for r in table if r["model"] == "beta"} == {"asset_triggered"}

    # each workload ends with its task: a Celery worker takes the next task about when the last one recorded its
    # end, not min_heartbeat_interval later (Airflow 3.3.2's supervisor, docs/deploy.md)
    worker_logs = [team_stack.airflow.worker_log(i).read_text(errors="replace") for i in (1, 2)]
    lags = _workload_lags(worker_logs, ended)
    slow = sorted(lag for lag in lags.values() if lag > WORKLOAD_LAG_LIMIT)
    print(f"workload end after the task's: {len(lags)} tasks, median {statistics.median(lags.values()):.2f}s, "
          f"max {max(lags.values()):.2f}s, over {WORKLOAD_LAG_LIMIT}s: {slow}")  # fmt: skip
    assert len(lags) >= len(ended) // 2, (len(lags), len(ended))
    assert len(slow) <= len(lags) // 20, slow

    # the tasks ran on both Celery workers
    per_worker = Counter({i: text.count("seqcls_release") for i, text in enumerate(worker_logs, 1)})
    assert all(per_worker[i] > 0 for i in (1, 2)), per_worker

    # seqcls history tells the same story as Airflow's run list: per run, what it recorded
    for model in MODELS:
        hist = _seqcls(team_stack, "history", "--model-name", model, "--json")
        assert hist.returncode == 0, hist.stderr
        by_run: dict[str, list[tuple[str, str | None]]] = {}
        for entry in json.loads(hist.stdout)["entries"]:
            by_run.setdefault((entry.get("who") or {}).get("run_id"), []).append((entry["kind"], entry.get("gate")))
        story = [(r["interval"], r["outcome"], by_run.get(r["run"], [])) for r in table if r["model"] == model]
        print(model, story)
        assert ("promote", None) in story[0][2], story
        assert story[1][2] == [("refused", "quality")], story
        assert story[2][2] == [], story  # skipped as champion: nothing served changed, nothing to tell
        assert story[3][2] == [("refused", "parity")], story
        assert all(("promote", None) in entries for _, _, entries in story[4:]), story
        assert set(by_run) <= {r["run"] for r in table if r["model"] == model}, by_run  # no entry from elsewhere

    # served == recorded == champion, for both models: the last retrain
    last = max(PROMOTED.values())
    status = _seqcls(team_stack, "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    first_disk = COSTS["after the first release"]["disk"]
    for s in json.loads(status.stdout):
        assert s["agree"] and not s["problems"], s
        assert s["recorded"]["serving"] == s["registry"]["champion_triton"] == last, s
        assert s["recorded"]["fingerprint"] == s["registry"]["champion_fingerprint"], s
        # refused candidates never became registry versions: Triton vN is MLflow vN
        assert s["registry"]["versions"][str(last)] == last, s
        assert all(int(t) == m for t, m in s["registry"]["versions"].items()), s
        served = {m: v for e in s["endpoints"].values() for m, v in e.items() if not m.endswith("_candidate")}
        assert served[s["model_name"]] == [last], served  # the ensemble: the last retrain only
        assert all(last in v and set(v) <= {last - 1, last} for v in served.values()), served  # parts: + previous
        # gc after each promote, through the scheduler: what the policy keeps (the five Triton versions of the
        # repository, served and previous among them, and their workspaces; the refused attempts' small evidence),
        # not one workspace's graphs per release: without gc, nine releases' graphs (seven promoted, two refused)
        disk = s["disk"]
        print(f"{s['model_name']}: disk after the first release {first_disk}, after {len(PLAN)} intervals {disk}")
        if s["model_name"] == "beta":  # the model whose first release's costs were recorded
            assert disk["heavy"] < 6 * first_disk["heavy"], (first_disk, disk)
            assert disk["triton"] < 6 * first_disk["triton"], (first_disk, disk)

    # Prometheus (the compose file's configuration and the project's rules) scrapes every Triton replica
    prometheus = team_stack.prometheus
    scraped = _wait(
        lambda: (
            {t["labels"]["instance"] for t in prometheus.api("targets")["activeTargets"] if t["health"] == "up"}
            >= set(team_stack.settings.triton_metrics)
        ),
        60,
        "every Triton scraped",
    )
    assert scraped
    groups = prometheus.api("rules")["groups"]
    assert groups and all(r["health"] == "ok" for g in groups for r in g["rules"]), groups
    served_by = prometheus.api("query", query='nv_inference_request_success{model="seqcls"}')["result"]
    assert {r["metric"]["instance"] for r in served_by} == set(team_stack.settings.triton_metrics), served_by

    # one notification per run that did something (a run skipped as champion sends nothing, by design)
    told = [r for r in table if r["outcome"] != "skipped"]
    with contextlib.suppress(AssertionError):
        _wait(lambda: len(receiver.received) >= len(told), 30, "one notification per run")
    titles = sorted(n.title for n in receiver.received)
    want = sorted(
        f"[seqcls] {r['model']}: "
        + (
            f"Triton v{PROMOTED[r['interval']]} (MLflow v{PROMOTED[r['interval']]}) promoted"
            if r["outcome"] == "promoted"
            else "release refused by the "
        )
        + ({2: "quality gate", 4: "parity gate"}.get(r["interval"], "") if r["outcome"] == "refused" else "")
        for r in told
    )
    assert titles == want, titles


def _nudged(good: Path, out: Path, delta: float = 1e-3) -> Path:
    """``good`` with its classifier bias moved by ``delta``: another fingerprint, the same labels (passes every
    gate)."""
    import paddle

    shutil.copytree(good, out)
    state = paddle.load(str(out / "model_state.pdparams"))
    state["classifier.bias"] = paddle.to_tensor(state["classifier.bias"].numpy() + delta)
    paddle.save(state, str(out / "model_state.pdparams"))
    return out


def _answers(settings, model: str) -> list:
    from seqcls.contract.names import ModelName
    from seqcls.serving.client import TritonOps, endpoints_from_settings

    preds, probs = TritonOps(endpoints_from_settings(settings)[0]).infer(
        ["某科技公司宣布裁员百分之十。", "x"], model=ModelName(model).names.ensemble
    )
    return [preds, [[round(float(p), 5) for p in row] for row in probs]]


def _plant(team_stack, plan: str | None) -> None:
    """Plant (or clear) the fault plan every Airflow process of the stack reads at each fault point."""
    path = Path(team_stack.airflow_env["SEQCLS_FAULT_PLAN"].removeprefix("@"))
    if plan:
        path.write_text(plan + "\n", encoding="utf-8")
    else:
        path.unlink(missing_ok=True)


def _at_fault(stack, dag_id: str, run_id: str, task_id: str, what: str) -> int:
    """The pid of ``task_id``'s process once its log says it reached its fault point (``stalls`` / ``pauses``);
    a paused one is also seen stopped (SIGSTOP) before this returns."""
    import re

    import psutil

    logs = Path(stack.env["AIRFLOW_HOME"]) / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"

    def found() -> int | None:
        for log_file in logs.glob("*.log"):
            hit = re.search(rf"fault: process (\d+) {what}", log_file.read_text(errors="replace"))
            if hit:
                return int(hit.group(1))
        return None

    pid = _wait(found, RUN_TIMEOUT, f"{task_id} of {run_id} at its fault point", interval=1)
    if what == "pauses":
        _wait(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 30, f"{task_id} stopped", interval=0.2)
    return pid


def _trigger(stack, dag_id: str, checkpoint: Path, token: str) -> str:
    body = {"logical_date": None, "conf": {"checkpoint": str(checkpoint)}}
    return _api(stack, "POST", f"/api/v2/dags/{dag_id}/dagRuns", body, token=token)["dag_run_id"]


def _ended(stack, dag_id: str, run_id: str, token: str, what: str) -> tuple[dict, dict[str, str]]:
    """Wait for the run to end: the run and its task states."""

    def finished() -> dict | None:
        r = _api(stack, "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", token=token)
        return r if r["state"] in ("success", "failed") else None

    run = _wait(finished, RUN_TIMEOUT, what, interval=2)
    tis = _api(stack, "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", token=token)["task_instances"]
    return run, {t["task_id"]: t["state"] for t in tis}


def _recorded(team_stack, model: str) -> dict:
    """The model's recorded serving state, as ``seqcls status --json`` reports it."""
    status = _seqcls(team_stack, "status", "--model-name", model, "--json")
    return json.loads(status.stdout)[0]["recorded"]


def _fingerprint(team_stack, model: str) -> str:
    return _recorded(team_stack, model)["fingerprint"]


def _settled(team_stack, model: str, changed_from: str | None = None) -> list:
    """served == recorded == champion (another checkpoint than ``changed_from`` when given), no release in
    flight; the same answers after a Triton restart (explicit mode: it loads nothing until sync loads the
    recorded state)."""
    status = _seqcls(team_stack, "status", "--model-name", model, "--json")
    (s,) = json.loads(status.stdout)
    assert status.returncode == 0 and s["agree"] and not s["problems"], s
    assert s["recorded"]["serving"] == s["registry"]["champion_triton"], s
    assert s["recorded"]["candidate"] is None, s
    assert s["recorded"]["fingerprint"] == s["registry"]["champion_fingerprint"], s
    if changed_from is not None:
        assert s["recorded"]["fingerprint"] != changed_from, s
    answers = _answers(team_stack.settings, model)
    with ThreadPoolExecutor(len(team_stack.tritons)) as pool:  # the replicas restart at once, as a fleet's would
        list(pool.map(lambda triton: (triton.stop(), triton.start()), team_stack.tritons))
    sync = _seqcls(team_stack, "sync")
    assert sync.returncode == 0, sync.stdout + sync.stderr
    assert _answers(team_stack.settings, model) == answers
    return answers


def _restarted(airflow, name: str) -> None:
    """Start worker ``name`` again (after a kill) and wait until Celery says it is ready."""
    index = int(name.rsplit("-", 1)[1])
    ready = airflow.worker_log(index).read_text(errors="replace").count(" ready.")
    airflow.restart(name)
    _wait(lambda: airflow.worker_log(index).read_text(errors="replace").count(" ready.") > ready, 120,
          f"{name} ready again")  # fmt: skip


def test_a_celery_worker_killed_during_reload_triton_is_undone(team_stack, trained) -> None:
    """kill -9 the worker that runs ``reload_triton`` (stalled by the fault seam with the candidate loaded
    beside the served version), then bring it back: the scheduler fails the task when its heartbeats stop,
    the run's rollback (on the other worker) undoes the attempt, and the served model, the recorded state
    and the MLflow champion are what they were — also after a Triton restart and one sync."""
    import psutil

    airflow, settings = team_stack.airflow, team_stack.settings
    stack = airflow.stack
    token = stack.token()
    dag_id = DAG_IDS["beta"]
    before = _answers(settings, "beta")
    served = _recorded(team_stack, "beta")["serving"]
    candidate = _nudged(trained["good"], settings.checkpoints_root / "beta" / "5-nudged")
    # reload_triton stalls once it has loaded the candidate beside the served version (the fault seam)
    _plant(team_stack, "stall@reconcile:after-widen")
    try:
        run_id = _trigger(stack, dag_id, candidate, token)
        task_pid = _at_fault(stack, dag_id, run_id, "reload_triton", "stalls")
    finally:
        _plant(team_stack, None)

    def tree(pid: int) -> set[int]:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}

    holder = next(n for n, p in stack.procs.items() if n.startswith("worker-") and task_pid in tree(p.pid))
    t_kill = time.perf_counter()
    airflow.kill(holder)  # the worker's whole process group: the worker, its task supervisor, the task
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(task_pid).kill()  # a machine that dies takes everything with it
    _restarted(airflow, holder)  # back before the scheduler gives up on the task
    done, states = _ended(stack, dag_id, run_id, token, "the run to end after the worker was killed")
    recovery = time.perf_counter() - t_kill
    print(f"\nworker {holder} killed during reload_triton: run {done['state']} {recovery:.0f}s later; {states}")
    assert done["state"] == "failed", states
    assert states["reload_triton"] == "failed" and states["rollback"] == "success", states
    assert states["promote"] in ("upstream_failed", "skipped"), states
    status = _seqcls(team_stack, "status", "--model-name", "beta", "--json")
    (s,) = json.loads(status.stdout)
    assert s["recorded"]["serving"] == s["registry"]["champion_triton"] == served, s
    assert _answers(settings, "beta") == before
    assert _settled(team_stack, "beta") == before


def test_two_runs_at_once_postgres_restarted_in_register_scheduler_killed_in_smoke_mlflow_down_in_promote(
    team_stack, trained
) -> None:
    """Two runs of one model triggered at once for one new checkpoint: ``max_active_runs=1`` queues the
    second, which then finds the checkpoint champion and skips — never two releases. The first meets three
    faults, one after the other, and carries on to promotion: PostgreSQL (Airflow's metadata and MLflow's
    store) restarted while ``register_model`` is between logging its artifacts and creating the version;
    the scheduler kill -9'd while ``smoke_test`` runs, then started again (it adopts the running task); the
    MLflow server kill -9'd as ``promote`` starts and back 15 s later (the MLflow client's retries carry the
    alias move over the outage). One run for the three: each fault is planted at its own point, and a run
    costs minutes on this stack."""
    import os
    import signal

    airflow = team_stack.airflow
    stack, dag_id = airflow.stack, DAG_IDS["beta"]
    token = stack.token()
    candidate = _nudged(trained["good"], team_stack.settings.checkpoints_root / "beta" / "6-nudged", delta=2e-3)
    champion = _fingerprint(team_stack, "beta")
    _plant(team_stack, "pause@register:artifacts,pause@task:before:smoke,pause@task:before:promote")
    paused: list[int] = []
    try:
        runs = [_trigger(stack, dag_id, candidate, token) for _ in range(2)]

        def started() -> str | None:
            listed = {r: _api(stack, "GET", f"/api/v2/dags/{dag_id}/dagRuns/{r}", token=token)["state"] for r in runs}
            running = [r for r, state in listed.items() if state == "running"]
            assert len(running) <= 1, listed  # max_active_runs=1
            return running[0] if running else None

        first = _wait(started, 120, "one of the two runs running")
        (second,) = [r for r in runs if r != first]
        paused.append(_at_fault(stack, dag_id, first, "register_model", "pauses"))
        t0 = time.perf_counter()
        team_stack.postgres.restart()
        pg_down = time.perf_counter() - t0
        # Airflow's scheduler exits when its loop meets the database down (the fresh-clone CI saw it once); the
        # compose file restarts it (restart: unless-stopped), and so does the drill
        scheduler = airflow.stack.procs["scheduler"]
        with contextlib.suppress(subprocess.TimeoutExpired):
            scheduler.wait(timeout=10)
        if scheduler.poll() is not None:
            print(f"\nthe scheduler exited with {scheduler.returncode} on the PostgreSQL restart: started again")
            airflow.restart("scheduler")
        os.kill(paused[-1], signal.SIGCONT)
        paused.append(_at_fault(stack, dag_id, first, "smoke_test", "pauses"))
        t_kill = time.perf_counter()
        airflow.kill("scheduler")
        os.kill(paused[-1], signal.SIGCONT)  # smoke_test runs on with no scheduler
        time.sleep(5)
        airflow.restart("scheduler")
        paused.append(_at_fault(stack, dag_id, first, "promote", "pauses"))
        scheduler_back = time.perf_counter() - t_kill  # from the kill to the next task's start
        _plant(team_stack, None)
        team_stack.mlflow.kill()
        t_stop = time.perf_counter()
        os.kill(paused[-1], signal.SIGCONT)
        time.sleep(15)
        team_stack.mlflow.start()
        mlflow_down = time.perf_counter() - t_stop
    finally:
        _plant(team_stack, None)
        for pid in paused:  # never leave a stopped task behind a failed assertion
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if team_stack.mlflow.proc is None or team_stack.mlflow.proc.poll() is not None:
            team_stack.mlflow.start()
    done, states = _ended(stack, dag_id, first, token, "the first run to end")
    recovery = time.perf_counter() - t_stop
    other, other_states = _ended(stack, dag_id, second, token, "the second run to end")
    print(f"\nPostgreSQL restarted in {pg_down:.1f}s during register_model; scheduler killed during smoke_test: "
          f"promote started {scheduler_back:.0f}s after the kill; MLflow down {mlflow_down:.0f}s during promote: "
          f"run {done['state']} {recovery:.0f}s after the stop; {states}; the second run: {other_states}")  # fmt: skip
    assert done["state"] == "success" and states["promote"] == "success", states
    assert states["rollback"] == "skipped", states
    assert other["state"] == "success" and other_states["promote"] == "skipped", other_states  # champion already
    assert other["start_date"] >= done["end_date"], (done, other)  # the second waited: never two at once
    _settled(team_stack, "beta", changed_from=champion)
    hist = _seqcls(team_stack, "history", "--model-name", "beta", "--json")
    kinds = {}
    for entry in json.loads(hist.stdout)["entries"]:
        kinds.setdefault((entry.get("who") or {}).get("run_id"), []).append(entry["kind"])
    assert "promote" in kinds.get(first, []) and second not in kinds, kinds

    # the module's DAG runs later (thirteen of beta): what the commands cost, what the releases hold
    _costs(team_stack, "after the last release")
    print(json.dumps(COSTS, indent=1))
    first_costs, last_costs = COSTS.get("after the first release"), COSTS["after the last release"]
    if first_costs:
        ratios = {k: round(v / first_costs["seconds"][k], 2) for k, v in last_costs["seconds"].items()}
        print(f"command time, last / first release: {ratios} (wall time of a fresh CLI; a shared host's load moves it)")


def _rest(url: str, password: str, method: str, path: str, body: dict | None = None) -> dict:
    """One call to Airflow's REST API as the stack's admin (a token per call: the test is short)."""
    import urllib.request

    def call(req_path: str, data: dict | None, method: str, headers: dict[str, str]) -> dict:
        payload = json.dumps(data).encode() if data is not None else None
        req = urllib.request.Request(f"{url}{req_path}", data=payload, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    json_type = {"Content-Type": "application/json"}
    token = call("/auth/token", {"username": "admin", "password": password}, "POST", json_type)["access_token"]
    return call(path, body, method, {**json_type, "Authorization": f"Bearer {token}"})


def test_make_stack_local_executor_variant_releases_then_stops_everything(tmp_path: Path, trained) -> None:
    """``make stack``'s command, with the compose file's documented LocalExecutor variant (the scheduler runs
    the tasks; no broker, no worker): up with the exports printed, one Asset-triggered release promoted through
    it (served == recorded == champion), and SIGTERM stops every process it started and removes the data. The
    default CeleryExecutor stack is the module's ``team_stack`` (the same class); its defaults are unit-tested."""
    import os
    import re
    import signal
    import urllib.request

    import psutil

    receiver = JsonReceiver()
    models_file = tmp_path / "models.yaml"
    models_file.write_text(
        f"models:\n  - name: beta\n    schedule: asset\n    checkpoints_root: beta\n    eval_set: eval.txt\n"
        f"    notify: ['{receiver.url()}']\n",
        encoding="utf-8",
    )
    err = tmp_path / "stderr.txt"
    argv = [sys.executable, "-m", "seqcls.cli", "team-stack", "--password", "pw", "--executor", "local"]
    argv += ["--tritons", "1", "--no-prometheus", "--models-file", str(models_file)]
    with open(err, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=fh, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        pattern = r"Airflow \((\w+), (\d) workers\) (\S+) .*logs (\S+)\.\n.*\n  export (.*)\n"
        while not (found := re.search(pattern, err.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        executor, workers, url, logs = found.group(1), int(found.group(2)), found.group(3), Path(found.group(4))
        exports = dict(item.split("=", 1) for item in found.group(5).split())
        assert (executor, workers) == ("LocalExecutor", 0)
        assert urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=10).status == 200
        assert set(exports) >= {"SEQCLS_TRITON_REPOSITORY", "SEQCLS_MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_PASSWORD"}
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children if c.is_running())
        assert "celery" not in names and "redis-server" not in names, names
        root = logs.parents[1]

        # one release through the variant: the checkpoint dropped, its Asset event posted, the scheduler runs it
        beta = Path(exports["SEQCLS_CHECKPOINTS_ROOT"]) / "beta"
        beta.mkdir(parents=True, exist_ok=True)
        demo_eval_file(beta / "eval.txt")
        shutil.copytree(trained["good"], beta / "1-good")
        mark_complete(beta / "1-good", run="train-beta-1")
        dag = DAG_IDS["beta"]

        def parsed() -> bool:
            try:
                return bool(_rest(url, "pw", "GET", f"/api/v2/dags/{dag}"))
            except OSError:  # 404 until the dag-processor has parsed the file
                return False

        _wait(parsed, 120, "the release DAG parsed")
        _rest(url, "pw", "PATCH", f"/api/v2/dags/{dag}", {"is_paused": False})
        assets = _rest(url, "pw", "GET", "/api/v2/assets?uri_pattern=seqcls://checkpoints/beta")["assets"]
        (asset,) = [a for a in assets if a["uri"] == "seqcls://checkpoints/beta"]
        _rest(url, "pw", "POST", "/api/v2/assets/events", {"asset_id": asset["id"], "extra": {"interval": 1}})

        def finished():
            runs = _rest(url, "pw", "GET", f"/api/v2/dags/{dag}/dagRuns")["dag_runs"]
            return runs[0] if runs and runs[0]["state"] in ("success", "failed") else None

        run = _wait(finished, RUN_TIMEOUT, "the LocalExecutor run", interval=3)
        tis = _rest(url, "pw", "GET", f"/api/v2/dags/{dag}/dagRuns/{run['dag_run_id']}/taskInstances")
        states = {t["task_id"]: t["state"] for t in tis["task_instances"]}
        assert _outcome(states) == "promoted", states
        env = {**os.environ, **exports}
        status = subprocess.run(
            [str(Path(sys.executable).parent / "seqcls"), "status", "--model-name", "beta", "--json"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert status.returncode == 0, status.stdout + status.stderr
        (s,) = json.loads(status.stdout)
        assert s["agree"] and s["recorded"]["serving"] == s["registry"]["champion_triton"] == 1, s
        assert [r.title for r in receiver.received], "no notification of the promote"
    finally:
        receiver.close()
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.read_text(errors="replace")[-3000:]
    assert "stopped: Airflow, the Tritons, the MLflow server and PostgreSQL" in out, out
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [(p.pid, p.name()) for p in alive]
    assert not root.exists()
