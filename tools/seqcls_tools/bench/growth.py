"""Growth benchmark: N days of daily releases through the CLI, and what disk, registry and each command cost.

``python -m seqcls_tools.bench.growth --days 365`` releases one tiny checkpoint a day (each from another seed)
onto a real local Triton with MLflow on sqlite, with a fast clock (no waiting between days; gc's minimum age
0, so what a day leaves is old enough for the next day's gc). Every 10th day is a worse retrain the quality
gate refuses; every 30th day's release is rolled back. Each CLI release runs gc after its promote (the
defaults: workspaces' heavy artifacts and MLflow versions archived beyond what serving and rollback need).

Measured every day: disk per kind and the release's wall time. At the checkpoint days (1, 30, 100, 365, those
≤ N): MLflow versions (all, archived), the serving log / registry journal sizes, and the wall time of
``status``, ``history --limit 20``, ``sync`` and a no-op release (the served checkpoint again; its own line's
"resolve + preflight" is the preflight time) — the median of ``--repeats`` rounds, the commands interleaved
within each round. The full release's time at a checkpoint is the median of the last three good releases up to
it. Ratios are against day 1 of the same run. Output in ``--out``: ``results.json``, ``results.md``,
``growth.png``.

``--read-cost N…`` instead times the state log's common readers in process on synthetic logs of N releases
(:func:`read_cost`): what the rotation's snapshots bound, below a CLI command's start-up.

Why tiny checkpoints whose predictions are fixed: the classifier's weights are zero and its bias decides
(every text → ``财经``, ``财经##融资``), so every good release scores the eval set perfectly whatever its seed,
and the worse retrain (its ``财经##融资`` bias negative) drops micro-F1 to 0.67: refused by the quality gate.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("seqcls_tools.bench.growth")

CHECKPOINT_DAYS = (1, 30, 100, 365)
ON_LABELS = ("财经", "财经##融资")
EVAL_TEXTS = 60
COMMANDS = ("status", "history", "sync", "noop_release", "preflight", "release")
_PREFLIGHT_RE = re.compile(r"resolve \+ preflight ([0-9.]+)s")


@dataclass
class GrowthConfig:
    days: int = 365
    out: Path = Path("var/bench/growth")
    repeats: int = 3
    keep_work: bool = False
    checkpoint_days: tuple[int, ...] = CHECKPOINT_DAYS


@dataclass
class Day:
    day: int
    action: str  # release | refused | rollback
    seconds: float
    exit_code: int
    disk: dict[str, int] = field(default_factory=dict)


def _checkpoint(root: Path, seed: int, *, worse: bool = False) -> Path:
    """A tiny ERNIE checkpoint from ``seed`` whose predictions are fixed by the classifier's bias (see above)."""
    import paddle

    from seqcls.release.completion import mark_complete
    from seqcls_tools.testing import TINY_LABELS, build_tiny_checkpoint

    out = build_tiny_checkpoint(root / f"ckpt-{seed}{'-worse' if worse else ''}", seed=seed, complete=False)
    params = out / "model_state.pdparams"
    state = paddle.load(str(params))
    weight = next(k for k in state if k.endswith("classifier.weight"))
    bias = next(k for k in state if k.endswith("classifier.bias"))
    on = set(ON_LABELS) - ({ON_LABELS[1]} if worse else set())
    state[weight] = paddle.zeros_like(state[weight])
    state[bias] = paddle.to_tensor([8.0 if label in on else -8.0 for label in TINY_LABELS], dtype="float32")
    paddle.save(state, str(params))
    mark_complete(out, run=f"seqcls_tools.bench.growth(seed={seed}, worse={worse})")
    return out


def _eval_set(path: Path) -> Path:
    from seqcls_tools.testing import TINY_CORPUS

    rows = [f"{TINY_CORPUS[i % len(TINY_CORPUS)]} 第{i}条\t{','.join(ON_LABELS)}" for i in range(EVAL_TEXTS)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _tree(path: Path) -> int:
    from seqcls.ops.disk import tree_bytes

    return tree_bytes(path) if path.exists() else 0


def _disk(env: dict[str, str]) -> dict[str, int]:
    """Bytes per kind: release workspaces (heavy / failed / evidence), the compacted releases' audit records,
    Triton repository, MLflow, eval sets (and two counts: workspaces, compacted releases)."""
    from seqcls.contract.names import ModelName
    from seqcls.ops.disk import disk_use
    from seqcls.settings import Settings

    settings = Settings.from_env()  # os.environ points at the run's home (run_growth sets it)
    use = disk_use(settings, ModelName("seqcls"))
    db = Path(env["SEQCLS_MLFLOW_TRACKING_URI"].removeprefix("sqlite:///"))
    return {
        "workspaces_heavy": use.heavy,
        "workspaces_failed": use.failed,
        "workspaces_evidence": use.evidence,
        "workspaces": use.workspaces,
        "audit_records": use.audit,
        "compacted": use.compacted,
        "triton": _tree(Path(str(settings.triton_repository))),
        "mlflow_artifacts": _tree(settings.mlflow_artifacts_dir),
        "mlflow_db": _tree(db),
        "evalsets": _tree(settings.eval_sets_dir),
    }


#: The entries of a day's ``disk`` that count things, not bytes.
COUNTS = ("workspaces", "compacted")


def _total(disk: dict[str, int]) -> int:
    return sum(v for k, v in disk.items() if k not in COUNTS)


def _mlflow_root() -> Path:
    from seqcls.settings import Settings

    return Settings.from_env().mlflow_artifacts_dir


def _registry(env: dict[str, str]) -> dict[str, int]:
    from mlflow.tracking import MlflowClient

    from seqcls.registry.archive import REMOVED_TAG

    uri = env["SEQCLS_MLFLOW_TRACKING_URI"]
    versions = MlflowClient(tracking_uri=uri, registry_uri=uri).search_model_versions("name = 'seqcls'")
    return {"versions": len(versions), "archived": sum(1 for v in versions if REMOVED_TAG in (v.tags or {}))}


def _logs(env: dict[str, str], repository: Path) -> dict[str, int]:
    home = Path(env["SEQCLS_HOME"])
    live = repository / ".seqcls-state.seqcls.log.jsonl"
    rotated = list(repository.glob(f"{live.name}.*"))  # compressed segments and their snapshots
    return {
        "state_log": _tree(live) + sum(_tree(p) for p in rotated),
        "state_log_live": _tree(live),
        "state_log_segments": sum(1 for p in rotated if not p.name.endswith(".snap")),
        "registry_journal": _tree(home / "registry-journal" / "seqcls.jsonl"),
        "monitor": _tree(home / "monitor"),
    }


#: A run's top-level artifact directories by kind (:mod:`seqcls.steps.register`, :mod:`seqcls.registry.runs`).
RUN_KINDS = {"parity": "run evidence (parity/)", "quality": "run evidence (quality/)", "tokenizer": "run tokenizer/",
             "checkpoint": "run checkpoint/ (config, labels)", "paddle_static": "run graphs",
             "torch_export": "run graphs", "onnx_fp32": "run graphs"}  # fmt: skip


def _model_kind(rel: str) -> str:
    """A logged model's file (relative to its ``artifacts/``) by kind."""
    if rel.endswith((".onnx", ".onnx.data", ".onnx_data")):
        return "model graph (.onnx)"
    if rel.startswith("code/") or rel == "pyfunc.py":
        return "model code (pyfunc.py, code/)"
    if rel.startswith("artifacts/"):
        return "model small artifacts (release, vocab, char classes)"
    if rel in ("input_example.json", "serving_input_example.json"):
        return "model input examples"
    return "model metadata (MLmodel, env files)"


def mlflow_inventory(tracking_uri: str, root: Path) -> list[dict[str, Any]]:
    """Every file under MLflow's artifact ``root`` by owner state and kind: whose run or logged model it belongs
    to (a version live / archived / compacted, or a run no version names, by its ``seqcls.outcome``) and what it
    is. Rows ``{"owner", "kind", "files", "bytes", "owners"}``; what to point at when MLflow artifacts grow."""
    from mlflow.tracking import MlflowClient

    from seqcls.registry.archive import COMPACTED_REMOVED_TAG, REMOVED_TAG
    from seqcls.registry.runs import OUTCOME_TAG

    c = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    state_of: dict[str, str] = {}  # run id / model id -> the state of the version that names it
    for mv in c.search_model_versions("name = 'seqcls'"):
        tags = mv.tags or {}
        state = "compacted" if COMPACTED_REMOVED_TAG in tags else "archived" if REMOVED_TAG in tags else "live"
        model_id = getattr(mv, "model_id", None) or str(mv.source or "").removeprefix("models:/")  # m-<hex>
        for key in (mv.run_id, model_id):
            if key:
                state_of[key] = f"version {state}"
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        parts = path.relative_to(root).parts
        if len(parts) >= 5 and parts[1] == "models" and parts[3] == "artifacts":
            owner_id, kind = parts[2], _model_kind("/".join(parts[4:]))
            owner = state_of.get(owner_id, "no version (logged model)")
        elif len(parts) >= 4 and parts[2] == "artifacts":
            owner_id, kind = parts[1], RUN_KINDS.get(parts[3], f"run {parts[3]}")
            if owner_id not in state_of:
                try:
                    outcome = c.get_run(owner_id).data.tags.get(OUTCOME_TAG, "?")
                except Exception:  # a directory MLflow no longer knows
                    outcome = "unknown run"
                state_of[owner_id] = f"no version (run {outcome})"
            owner = state_of[owner_id]
        else:
            owner_id, owner, kind = "", "other", "/".join(parts[:3])
        row = rows.setdefault((owner, kind), {"owner": owner, "kind": kind, "files": 0, "bytes": 0, "owners": set()})
        row["files"] += 1
        row["bytes"] += path.stat().st_size
        row["owners"].add(owner_id)
    return [{**r, "owners": len(r["owners"])} for r in sorted(rows.values(), key=lambda r: -r["bytes"])]


def inventory_markdown(rows: list[dict[str, Any]], releases: int) -> str:
    """The inventory as a table, with bytes per release (``releases``: the run's days)."""
    lines = ["| owner | kind | runs/models | files | bytes | bytes per release |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['owner']} | {r['kind']} | {r['owners']} | {r['files']} | {r['bytes']:,} | "
                     f"{r['bytes'] / max(releases, 1):,.0f} |")  # fmt: skip
    total = sum(r["bytes"] for r in rows)
    lines.append(f"| **all** | | | {sum(r['files'] for r in rows)} | {total:,} | {total / max(releases, 1):,.0f} |")
    return "\n".join(lines) + "\n"


class _Cli:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def run(self, *args: str, check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "seqcls.cli", *args], env=self.env, capture_output=True, text=True, timeout=900
        )
        seconds = time.perf_counter() - t0
        if check and out.returncode != 0:
            raise RuntimeError(f"seqcls {' '.join(args)} exited {out.returncode}: {out.stderr[-3000:]}")
        return seconds, out


def _day_action(day: int) -> str:
    if day % 30 == 0:
        return "rollback"  # the day's release goes live, then is rolled back
    return "refused" if day % 10 == 0 else "release"


def _measure(cli: _Cli, served: Path, evalset: Path, repeats: int, *, warmup: bool) -> dict[str, list[float]]:
    """Each command's wall times; ``warmup``: one round first, not counted (a cold page cache on day 1)."""
    if warmup:
        _measure(cli, served, evalset, 1, warmup=False)
    times: dict[str, list[float]] = {k: [] for k in ("status", "history", "sync", "noop_release", "preflight")}
    for _ in range(repeats):  # interleaved: a drift of the machine touches every command alike
        times["status"].append(cli.run("status")[0])
        times["history"].append(cli.run("history", "--limit", "20")[0])
        times["sync"].append(cli.run("sync")[0])
        seconds, out = cli.run("release", "--checkpoint", str(served), "--eval-set", str(evalset))
        times["noop_release"].append(seconds)
        found = _PREFLIGHT_RE.search(out.stdout + out.stderr)
        if found:
            times["preflight"].append(float(found.group(1)))
    return times


def _local_server(work: Path):
    """A local Triton on free ports over ``work/repo`` and the environment that points the CLI at it."""
    from seqcls.localtriton import LocalTriton, TritonServerConfig, free_ports

    http, grpc, metrics = free_ports(3)
    server = LocalTriton(
        TritonServerConfig(
            repository=work / "repo",
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            state_dir=work / "triton-state",
        )
    )
    own = {
        "SEQCLS_HOME": str(work / "home"),
        "SEQCLS_TRITON_REPOSITORY": str(work / "repo"),
        "SEQCLS_TRITON_GRPC": server.config.grpc_url,
        "SEQCLS_TRITON_HTTP": server.config.http_url,
        "SEQCLS_MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "SEQCLS_GC_MIN_AGE": "0",  # the fast clock: yesterday's workspace is old enough
        "GLOG_minloglevel": "2",
    }
    return server, own


def run_growth(cfg: GrowthConfig) -> dict[str, Any]:
    """Run the simulation (see the module docstring); returns what results.json holds."""
    from seqcls_tools.bench.machine import loadavg, machine_facts

    cfg.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="seqcls-growth-"))
    server, own = _local_server(work)
    saved = dict(os.environ)
    os.environ.update(own)  # this process's own reads (disk, MLflow) see what the CLI sees; restored at the end
    os.environ.pop("SEQCLS_FAULT_PLAN", None)
    env = dict(os.environ)
    cli = _Cli(env)
    evalset = _eval_set(work / "eval.txt")
    days: list[Day] = []
    points: list[dict[str, Any]] = []
    served: list[Path] = []  # the served checkpoint last (a rollback serves the one before)
    release_seconds: list[float] = []
    load_start = loadavg()
    t_start = time.perf_counter()
    server.start()
    try:
        for day in range(1, cfg.days + 1):
            action = _day_action(day)
            ckpt = _checkpoint(work / "ckpts", day, worse=action == "refused")
            seconds, out = cli.run("release", "--checkpoint", str(ckpt), "--eval-set", str(evalset), check=False)
            if action == "refused":
                if out.returncode == 0:
                    raise RuntimeError(f"day {day}: the worse retrain was not refused: {out.stdout[-2000:]}")
            elif out.returncode != 0:
                raise RuntimeError(f"day {day}: release exited {out.returncode}: {out.stderr[-3000:]}")
            else:
                served.append(ckpt)
                release_seconds.append(seconds)
            if action == "rollback":
                cli.run("rollback", "--model-name", "seqcls", "--reason", f"growth day {day}")
                served.pop()
            days.append(Day(day, action, round(seconds, 3), out.returncode, _disk(env)))
            log.info("day %d: %s in %.1fs, %.2f MB", day, action, seconds, _total(days[-1].disk) / 1e6)
            if day in cfg.checkpoint_days or day == cfg.days:
                times = _measure(cli, served[-1], evalset, cfg.repeats, warmup=not points)
                times["release"] = release_seconds[-3:]
                points.append(
                    {
                        "day": day,
                        "disk": days[-1].disk,
                        "disk_total": _total(days[-1].disk),
                        "mlflow": _registry(env),
                        "logs": _logs(env, work / "repo"),
                        "seconds": {k: round(statistics.median(v), 3) for k, v in times.items() if v},
                        "samples": {k: [round(x, 3) for x in v] for k, v in times.items()},
                    }
                )
                log.info("day %d measured: %s", day, points[-1]["seconds"])
        inventory = mlflow_inventory(env["SEQCLS_MLFLOW_TRACKING_URI"], _mlflow_root())
    finally:
        server.stop()
        os.environ.clear()
        os.environ.update(saved)
        if not cfg.keep_work:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log.info("kept the run's home, repository and MLflow store: %s", work)
    results = {
        "config": {**asdict(cfg), "out": str(cfg.out)},
        "machine": machine_facts(),
        "loadavg": {"start": load_start, "end": loadavg()},
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "days": [asdict(d) for d in days],
        "points": points,
        "ratios": _ratios(points),
        "mlflow_inventory": inventory,
    }
    (cfg.out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False, default=str))
    (cfg.out / "results.md").write_text(markdown(results), encoding="utf-8")
    _plot(results, cfg.out / "growth.png")
    return results


def _ratios(points: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each later checkpoint's figure over day 1's (same run)."""
    if not points:
        return {}
    first = points[0]
    out: dict[str, dict[str, float]] = {}
    for p in points[1:]:
        r = {k: round(v / first["seconds"][k], 2) for k, v in p["seconds"].items() if first["seconds"].get(k)}
        r["disk_total"] = round(p["disk_total"] / first["disk_total"], 2)
        out[str(p["day"])] = r
    return out


def markdown(results: dict[str, Any]) -> str:
    """The report: conditions, one table per checkpoint day, the ratios against day 1."""
    m = results["machine"]
    from seqcls_tools.bench.machine import isa_text

    mb = 1e6
    lines = [
        f"# Growth: {results['config']['days']} days of daily releases",
        "",
        f"CPU {m['cpu_model']} ({m['cpus_usable']} usable CPUs; {isa_text(m['isa'])}); load average "
        f"{results['loadavg']['start']} → {results['loadavg']['end']}; wall time {results['wall_seconds']} s.",
        "",
        "| day | workspaces (heavy / evidence / failed MB) | compacted (audit MB) | Triton MB | MLflow artifacts MB "
        "| mlflow.db MB | total MB | MLflow versions (archived) | state log KB | journal KB |",
        "|---:|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for p in results["points"]:
        d, lg = p["disk"], p["logs"]
        lines.append(
            f"| {p['day']} | {d['workspaces']} ({d['workspaces_heavy'] / mb:.2f} / {d['workspaces_evidence'] / mb:.2f}"
            f" / {d['workspaces_failed'] / mb:.2f}) | {d.get('compacted', 0)} ({d.get('audit_records', 0) / mb:.2f}) "
            f"| {d['triton'] / mb:.2f} | {d['mlflow_artifacts'] / mb:.2f} | "
            f"{d['mlflow_db'] / mb:.2f} | {p['disk_total'] / mb:.2f} | {p['mlflow']['versions']} "
            f"({p['mlflow']['archived']}) | {lg['state_log'] / 1e3:.1f} | {lg['registry_journal'] / 1e3:.1f} |"
        )
    lines += ["", "Wall time, seconds (median of the interleaved repeats; release: of the last 3 good releases):", ""]
    lines += ["| day | " + " | ".join(COMMANDS) + " |", "|---:|" + "---:|" * len(COMMANDS)]
    for p in results["points"]:
        lines.append(f"| {p['day']} | " + " | ".join(str(p["seconds"].get(c, "—")) for c in COMMANDS) + " |")
    lines += ["", "Ratios against day 1 (same run):", ""]
    keys = [*COMMANDS, "disk_total"]
    lines += ["| day | " + " | ".join(keys) + " |", "|---:|" + "---:|" * len(keys)]
    for day, r in results["ratios"].items():
        lines.append(f"| {day} | " + " | ".join(f"{r[k]:.2f}" if k in r else "—" for k in keys) + " |")
    if results.get("mlflow_inventory"):
        lines += ["", f"MLflow artifacts after day {results['config']['days']}'s gc, by owner and kind:", ""]
        lines.append(inventory_markdown(results["mlflow_inventory"], results["config"]["days"]).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = results["days"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = [d["day"] for d in days]
    for key in ("workspaces_heavy", "workspaces_evidence", "audit_records", "triton", "mlflow_artifacts", "mlflow_db"):
        a.plot(x, [d["disk"].get(key, 0) / 1e6 for d in days], label=key)
    a.plot(x, [_total(d["disk"]) / 1e6 for d in days], label="total", color="black", linewidth=2)
    a.set_xlabel("day")
    a.set_ylabel("MB")
    a.set_title("disk per kind")
    a.legend(fontsize=8)
    rel = [(d["day"], d["seconds"]) for d in days if d["action"] != "refused"]
    b.plot([r[0] for r in rel], [r[1] for r in rel], ".", color="grey", label="release (each day)")
    pts = results["points"]
    for cmd in ("status", "history", "sync", "noop_release"):
        b.plot([p["day"] for p in pts], [p["seconds"].get(cmd) for p in pts], "o-", label=cmd)
    b.set_xlabel("day")
    b.set_ylabel("seconds")
    b.set_title("wall time (CLI, incl. interpreter start)")
    b.set_ylim(bottom=0)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_cost(releases: int, rounds: int = 7) -> dict[str, Any]:
    """The state log's common readers on a synthetic log of ``releases`` daily releases (candidate, exposure and
    champion move each; a rollback every 30th), rotated by gc's path at the default threshold every 10th day:
    bytes read and the median in-process time of the recovery read (``read_log``) and of the call behind
    ``history --limit 20`` (MLflow answered by a stub), CLI start-up excluded. Counts, not a gate: no assert."""
    from seqcls.contract.names import ModelName
    from seqcls.ops import history as hist
    from seqcls.serving import statelog
    from seqcls.serving.state import ServingState, read_log, write_state
    from seqcls.settings import Settings

    with tempfile.TemporaryDirectory(prefix="seqcls-readcost-") as tmp:
        settings = Settings.from_env(home=tmp, triton_repository=str(Path(tmp) / "repo"))  # never the env's
        repo, name = Path(str(settings.triton_repository)), ModelName("seqcls")
        repo.mkdir(parents=True, exist_ok=True)
        state = ServingState.empty(name)
        for v in range(1, releases + 1):
            fp = f"{v:064x}"
            cand = write_state(repo, state.with_candidate(v, fp, "bench"), expected_generation=state.generation)
            state = write_state(repo, cand.promoted(v, fp, "bench"), expected_generation=cand.generation)
            statelog.append_event(repo, name, "promote", version=v, mlflow=v, mlflow_previous=v - 1 or None)
            if v % 30 == 0:
                state = write_state(repo, state.rolled_back("bench", "day 30"), expected_generation=state.generation)
            if v % 10 == 0:
                hist.rotate_log(repo, name, settings.statelog_rotate_bytes)
        saved_lookup, saved_read = hist._Registry.lookup, Path.read_bytes
        hist._Registry.lookup = lambda self, m, fp, key: ((int(fp, 16) if fp else None), {})  # type: ignore[method-assign]
        read: list[int] = []

        def spy(self: Path) -> bytes:
            data = saved_read(self)
            read.append(len(data))
            return data

        out: dict[str, Any] = {"releases": releases}
        try:
            Path.read_bytes = spy  # type: ignore[method-assign]
            calls = {
                "read_log": lambda: read_log(repo, name),
                "history_limit_20": lambda: hist.history(settings, [name], limit=20),
            }
            for label, call in calls.items():
                times = []
                for _ in range(rounds):
                    read.clear()
                    t0 = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t0)
                out[label] = {"ms": round(statistics.median(times) * 1000, 2), "bytes_read": sum(read)}
        finally:
            hist._Registry.lookup, Path.read_bytes = saved_lookup, saved_read  # type: ignore[method-assign]
        path = statelog.log_path(repo, name)
        out["segments"] = len(statelog.segments(path))
        out["live_bytes"] = path.stat().st_size if path.exists() else 0  # just rotated: no live file yet
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seqcls_tools.bench.growth", description=__doc__.split("\n")[0])
    p.add_argument("--days", type=int, default=365, help="days simulated (one release a day)")
    p.add_argument("--out", type=Path, default=Path("var/bench/growth"), help="where results.json/.md and the plot go")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds of the commands at each checkpoint day")
    p.add_argument("--keep-work", action="store_true", help="keep the home, repository and MLflow store")
    p.add_argument(
        "--inventory",
        type=Path,
        metavar="WORK",
        help="instead: the MLflow artifacts of a kept run's work directory (--keep-work) by owner and kind",
    )
    p.add_argument("--read-cost", type=int, nargs="+", metavar="RELEASES",
                   help="instead: the state log's readers on synthetic logs of N releases (JSON lines)")  # fmt: skip
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.inventory:
        work = args.inventory
        os.environ["SEQCLS_HOME"] = str(work / "home")
        rows = mlflow_inventory(f"sqlite:///{work / 'mlflow.db'}", _mlflow_root())
        print(inventory_markdown(rows, args.days))
        return 0
    if args.read_cost:
        logging.getLogger().setLevel(logging.ERROR)
        for n in args.read_cost:
            print(json.dumps(read_cost(n)))
        return 0
    cfg = GrowthConfig(days=args.days, out=args.out, repeats=args.repeats, keep_work=args.keep_work)
    results = run_growth(cfg)
    print(markdown(results))
    print(f"files: {args.out / 'results.json'}, {args.out / 'results.md'}, {args.out / 'growth.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
