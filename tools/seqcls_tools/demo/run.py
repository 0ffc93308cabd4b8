"""The main job on embedded defaults: a trained classifier released end to end through Airflow.

What ``make demo`` runs (``seqcls demo``): build (or reuse) the demo checkpoint, start the local
Triton, run the ``seqcls_release`` DAG with ``airflow dags test`` on a sqlite Airflow and a sqlite
MLflow — everything on loopback, under one directory — then report what is served and ask it a
few questions over gRPC. Then the scheduled-retraining story: a worse retrain (2 epochs) goes
through the same DAG and the quality gate refuses it, with what is served and the champion
unchanged. Both runs are judged on the demo's held-out split, the operator's eval set
(``<checkpoints root>/demo-eval.jsonl``). Airflow is driven through its CLI (a subprocess with a timeout), so this
module imports no Airflow. Nothing is left running unless ``keep_servers`` is set.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls.errors import SeqclsError, ServingError
from seqcls.settings import PROJECT_ROOT, Settings

log = logging.getLogger(__name__)

DAG_ID = "seqcls_release"
EXAMPLES = (
    "凌云航空确认优化研发部门人员，裁员比例约为3%。",
    "蓝海电子在深交所创业板上市当天发布新款AI芯片。",
    "甘肃地震已造成7人遇难，救援工作正在进行。",
    "Sarah Miller resigned from the board of Google.",
    "法院一审判决该公司赔偿用户损失200万元。",
)


#: The worse retrain: the demo model trained for 2 epochs (held-out micro-F1 ~0.7 against ~0.99).
RETRAIN = "demo-v2-retrain"
RETRAIN_EPOCHS = 2
#: The operator's eval set, under the checkpoints root (a DAG run reads eval sets only from there).
EVAL_SET = "demo-eval.jsonl"


@dataclass
class Retrain:
    """What happened to the worse retrain: refused by the quality gate, and what is served after it."""

    checkpoint: Path
    trained: dict[str, Any] | None
    refused: bool
    reason: str
    candidate: dict[str, float]
    champion: dict[str, float]
    served_version: int | None
    champion_version: int | None
    seconds: float
    recorded_at: str | None = None  # refused by an earlier run against the same champion and eval set


@dataclass
class DemoResult:
    checkpoint: Path
    trained: dict[str, Any] | None
    already_released: bool
    served_version: int | None
    smoke: dict[str, Any]
    champion_version: int | None
    predictions: list[tuple[str, list[dict]]]
    seconds: dict[str, float] = field(default_factory=dict)
    dag_log: Path | None = None
    settings: Settings | None = None
    kept_servers: bool = False
    retrain: Retrain | None = None


def demo_dir() -> Path:
    return Path(os.environ.get("SEQCLS_DEMO_DIR") or PROJECT_ROOT / "var" / "demo").resolve()


def airflow_env(root: Path, settings: Settings) -> dict[str, str]:
    """Environment for an embedded Airflow 3 (sqlite, no examples) pointed at this project."""
    airflow_home = root / "airflow"
    airflow_home.mkdir(parents=True, exist_ok=True)
    grpc = ",".join(settings.triton_grpc)
    http = ",".join(settings.triton_http)
    host, _, port = settings.triton_grpc[0].rpartition(":")
    conn = {
        "conn_type": "generic",
        "host": host,
        "port": int(port),
        "extra": {"grpc_endpoints": grpc, "http_endpoints": http, "repository": str(settings.triton_repository)},
    }
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__PARALLELISM": "4",
        # A worker is free for its next task when its supervisor sees the last one exit, which Airflow 3.3.2's
        # supervisor may see only at its next heartbeat wake-up (docs/deploy.md): every 1 s, not 5 s.
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}",
        "SEQCLS_HOME": str(settings.home),
        "SEQCLS_MODELS_FILE": "none",  # the demo releases the default model through seqcls_release
        "SEQCLS_CHECKPOINTS_ROOT": str(settings.checkpoints_root),
        "SEQCLS_TRITON_GRPC": grpc,
        "SEQCLS_TRITON_HTTP": http,
        "SEQCLS_MLFLOW_TRACKING_URI": str(settings.mlflow_tracking_uri),
        "AIRFLOW_CONN_TRITON_DEFAULT": json.dumps(conn),
        "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps(
            {"conn_type": "generic", "extra": {"tracking_uri": str(settings.mlflow_tracking_uri)}}
        ),
    }


def airflow_cli(args: list[str], env: dict[str, str], *, timeout: float, log_file: Path | None = None):
    cmd = [str(Path(sys.executable).parent / "airflow"), *args]
    log.info("airflow %s (timeout %.0fs)", " ".join(args[:3]), timeout)
    out = open(log_file, "wb") if log_file else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SeqclsError(
            f"`airflow {' '.join(args[:3])}` did not finish in {timeout:.0f}s"
            + (f"; see {log_file}" if log_file else "")
        ) from exc
    finally:
        if log_file:
            out.close()


def ensure_eval_set(settings: Settings) -> Path:
    """The demo's held-out split as the operator's eval set, under the checkpoints root."""
    from seqcls_tools.demo import DATA_DIR

    target = Path(settings.checkpoints_root or settings.home / "checkpoints") / EVAL_SET
    data = (DATA_DIR / "test.jsonl").read_bytes()
    if not target.is_file() or target.read_bytes() != data:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return target


def ensure_checkpoint(
    settings: Settings, *, quick: bool = False, name: str = "demo-v1", epochs: int | None = None
) -> tuple[Path, dict[str, Any] | None]:
    ckpt = Path(settings.checkpoints_root or settings.home / "checkpoints") / name
    if (ckpt / "config.json").is_file() and (ckpt / "label.txt").is_file():
        metrics = ckpt / "metrics.json"
        log.info("demo: reusing the trained checkpoint %s", ckpt)
        from seqcls.release.completion import mark_complete, read_marker

        if read_marker(ckpt) is None:  # trained before completion markers existed
            mark_complete(ckpt, run="seqcls_tools.demo (trained before completion markers)")
        return ckpt, json.loads(metrics.read_text()) if metrics.is_file() else None
    from seqcls_tools.demo.train import train_demo_checkpoint

    log.info("demo: training the demo classifier into %s (bundled dataset, 2 CPU cores)", ckpt)
    # epoch-bound, not time-bound: the same F1 on a busy machine as on a quiet one (quick too: under load
    # its 40 s budget once stopped after 1 epoch at micro-F1 0.0, and a worse retrain then looked better)
    result = train_demo_checkpoint(ckpt, quick=quick, epochs=epochs, max_seconds=3600)
    return ckpt, {
        "micro_f1": result.micro_f1,
        "macro_f1": result.macro_f1,
        "epochs": result.epochs,
        "seconds": result.seconds,
    }


def run_demo(*, keep_servers: bool = False, quick: bool = False, timeout: float = 1800) -> DemoResult:
    """Release the demo checkpoint through the Airflow DAG and report what Triton serves."""
    from seqcls.localtriton import LocalTriton, TritonServerConfig
    from seqcls.registry import ledger as registry
    from seqcls.release.intake import open_release
    from seqcls.release.keys import release_key
    from seqcls.serving.client import TritonOps, endpoints_from_settings
    from seqcls.serving.repository import Repository
    from seqcls.steps import ORDER

    root = demo_dir()
    settings = Settings.from_env(home=Path(os.environ.get("SEQCLS_HOME") or root / "home"))
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    ckpt, trained = ensure_checkpoint(settings, quick=quick)
    ensure_eval_set(settings)
    timings["checkpoint"] = time.perf_counter() - t0
    release = open_release(ckpt, settings=settings)
    already = registry.champion_release_key(settings, release.config.model_name) == release_key(release)

    server = LocalTriton(TritonServerConfig.from_settings(settings))
    started_here = not server.status().live
    t1 = time.perf_counter()
    server.start()
    timings["triton_start"] = time.perf_counter() - t1
    try:
        env = airflow_env(root, settings)
        db = Path(env["AIRFLOW_HOME"]) / "airflow.db"
        if not db.exists():
            t1 = time.perf_counter()
            if airflow_cli(["db", "migrate"], env, timeout=600).returncode != 0:
                raise SeqclsError("`airflow db migrate` failed; run it by hand to see why")
            timings["airflow_db_migrate"] = time.perf_counter() - t1
        logs = root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        dag_log = logs / f"dag-test-{stamp}.log"
        # skip_if_champion off: a re-run re-verifies (and reloads a restarted Triton) instead of skipping
        conf = json.dumps({"checkpoint": str(ckpt), "skip_if_champion": False, "eval_set": EVAL_SET})
        t1 = time.perf_counter()
        proc = airflow_cli(
            ["dags", "test", DAG_ID, datetime.now(UTC).isoformat(timespec="seconds"), "-c", conf],
            env,
            timeout=timeout,
            log_file=dag_log,
        )
        timings["dag_run"] = time.perf_counter() - t1
        failed = [s for s in ORDER if not release.workspace.succeeded(s)]
        if proc.returncode != 0 or failed:
            raise SeqclsError(
                f"the {DAG_ID} run failed (exit {proc.returncode}; steps not ok: {failed}); task logs: {dag_log}"
            )
        repo = Repository.from_settings(settings, release.config.model_name)
        version = repo.serving_version()
        retrain = release_retrain(settings, env, logs, stamp, quick=quick, timeout=timeout)
        client = TritonOps(endpoints_from_settings(settings)[0])
        if not client.ready(repo.names.ensemble, version):
            raise ServingError(f"{repo.names.ensemble} version {version} is not ready after the run")
        preds, _ = client.infer(list(EXAMPLES), model=repo.names.ensemble)
        champion = registry.alias_version(settings, release.config.model_name, registry.CHAMPION)
        timings["retrain_refused"] = retrain.seconds
        timings["total"] = time.perf_counter() - t0
        return DemoResult(
            checkpoint=ckpt,
            trained=trained,
            already_released=already,
            served_version=version,
            smoke=release.workspace.require("smoke")["summary"],
            champion_version=champion,
            predictions=list(zip(EXAMPLES, preds, strict=True)),
            seconds=timings,
            dag_log=dag_log,
            settings=settings,
            kept_servers=keep_servers,
            retrain=retrain,
        )
    finally:
        if started_here and not keep_servers:
            server.stop()


def release_retrain(
    settings: Settings, env: dict[str, str], logs: Path, stamp: str, *, quick: bool, timeout: float
) -> Retrain:
    """Train (or reuse) the worse retrain, run the DAG on it, and check the quality gate refused it with
    nothing changed: the served version and MLflow's champion as before. Anything else is an error."""
    from seqcls.registry import ledger as registry
    from seqcls.release.intake import open_release
    from seqcls.serving.repository import Repository

    t0 = time.perf_counter()
    ckpt, trained = ensure_checkpoint(settings, quick=True, name=RETRAIN, epochs=RETRAIN_EPOCHS)
    release = open_release(ckpt, settings=settings)
    repo = Repository.from_settings(settings, release.config.model_name)
    before = (repo.serving_version(), registry.alias_version(settings, release.config.model_name, registry.CHAMPION))
    recorded = recorded_refusal(release, before[0], ensure_eval_set(settings))
    if recorded:  # a second `make demo`: the same retrain, champion and eval set were refused already
        log.info(
            "demo: the retrain %s was refused at %s against this champion and eval set — not run again", ckpt, recorded
        )
        returncode, dag_log = 1, None
    else:
        log.info("demo: releasing the retrain %s — the quality gate should refuse it", ckpt)
        conf = json.dumps({"checkpoint": str(ckpt), "skip_if_champion": False, "eval_set": EVAL_SET})
        dag_log = logs / f"dag-test-{stamp}-retrain.log"
        when = datetime.now(UTC).isoformat(timespec="seconds")
        returncode = airflow_cli(
            ["dags", "test", DAG_ID, when, "-c", conf], env, timeout=timeout, log_file=dag_log
        ).returncode
    record = release.workspace.step("evaluate") or {}
    after = (repo.serving_version(), registry.alias_version(settings, release.config.model_name, registry.CHAMPION))
    gate = record.get("status") == "failed" and "Quality gate refused" in record.get("error", "")
    refused = returncode != 0 and gate
    if not refused or after != before:
        raise SeqclsError(
            f"the worse retrain {ckpt} was not refused by the quality gate as expected (exit {returncode}, "
            f"evaluate {record.get('status')}; served/champion {before} -> {after}); task logs: {dag_log}"
        )
    evaluation = json.loads((release.workspace.failed_dir("evaluate") / "evaluation.json").read_text(encoding="utf-8"))
    pick = ("micro_f1", "macro_f1")
    return Retrain(
        checkpoint=ckpt,
        trained=trained,
        refused=True,
        reason=evaluation.get("summary", ""),
        candidate={k: evaluation["candidate"][k] for k in pick},
        champion={k: evaluation["champion"][k] for k in pick} if evaluation.get("champion") else {},
        served_version=after[0],
        champion_version=after[1],
        seconds=time.perf_counter() - t0,
        recorded_at=recorded,
    )


def recorded_refusal(release, served: int | None, eval_set: Path) -> str | None:
    """When this retrain's last gate refused it against the version served now, on these very eval-set bytes,
    with the default rules: when that was (the gate is deterministic, so running it again shows nothing new)."""
    import hashlib

    from seqcls.steps.evaluate import gate_inputs

    record = release.workspace.step("evaluate") or {}
    path = release.workspace.failed_dir("evaluate") / "evaluation.json"
    if record.get("status") != "failed" or "Quality gate refused" not in record.get("error", "") or not path.is_file():
        return None
    evaluation = json.loads(path.read_text(encoding="utf-8"))
    sha = hashlib.sha256(eval_set.read_bytes()).hexdigest()
    same_rules = record.get("inputs", {}).get("rules") == gate_inputs(release, None, None)["rules"]
    same = evaluation.get("champion_version") == served and evaluation.get("eval_set", {}).get("sha256") == sha
    return record.get("finished_at") if same and same_rules and served is not None else None


def report(result: DemoResult) -> str:
    """The text ``seqcls demo`` prints: what is served, how it answered, where to look next."""
    s = result.settings or Settings.from_env()
    lines = []
    if result.already_released:
        lines.append(
            f"Checkpoint {result.checkpoint} was already released (MLflow champion) — nothing new was "
            "published; the run re-verified it."
        )
    if result.trained:
        lines.append(
            f"Demo classifier: held-out micro-F1 {result.trained['micro_f1']:.3f}, macro-F1 "
            f"{result.trained['macro_f1']:.3f}."
        )
    lines += [
        f"seqcls serves Triton v{result.served_version}; MLflow champion: MLflow v{result.champion_version}.",
        f"Smoke test: {result.smoke.get('texts')} golden texts answered as validated "
        f"(p50 {result.smoke.get('p50_ms')} ms, p95 {result.smoke.get('p95_ms')} ms).",
        "",
        "Predictions over gRPC:",
    ]
    for text, preds in result.predictions:
        labels = ", ".join(f"{p['label']} ({p['confidence']:.2f})" for p in preds) or "(no label above threshold)"
        lines.append(f"  {text}\n      → {labels}")
    rt = result.retrain
    if rt is not None:
        trained = f" (held-out micro-F1 {rt.trained['micro_f1']:.3f} at training)" if rt.trained else ""
        lines += [
            "",
            f"Retrain {rt.checkpoint.name}{trained}: refused by the quality gate"
            + (f" (at {rt.recorded_at}; same champion and eval set since, not run again)" if rt.recorded_at else "")
            + " —",
            f"  candidate micro/macro-F1 {rt.candidate['micro_f1']:.3f}/{rt.candidate['macro_f1']:.3f} vs champion "
            f"{rt.champion.get('micro_f1', 0):.3f}/{rt.champion.get('macro_f1', 0):.3f} on {EVAL_SET}",
            f"  {rt.reason[:400]}",
            f"  seqcls still serves Triton v{rt.served_version}; MLflow champion still MLflow v{rt.champion_version}.",
        ]
    timing = ", ".join(f"{k} {v:.0f}s" for k, v in result.seconds.items())
    lines += [
        "",
        f"Timings: {timing}.",
        "Look further:",
        f"  DAG task logs:   {result.dag_log}",
        f"  MLflow UI:       .venv/bin/mlflow ui --backend-store-uri {s.mlflow_tracking_uri} --host 127.0.0.1",
        "  Airflow UI:      make airflow-ui   (login printed at start)",
        f"  Triton:          gRPC {s.triton_grpc[0]}, HTTP http://{s.triton_http[0]}/v2/models/seqcls"
        + ("" if result.kept_servers else "  (stopped; `make demo KEEP=1` keeps it up)"),
    ]
    return "\n".join(lines)
