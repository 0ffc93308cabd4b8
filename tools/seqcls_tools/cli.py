"""The development subcommands of ``seqcls``: ``demo``, ``airflow-ui``, ``team-registry``, ``bench``,
``demo-checkpoint``.

``seqcls.cli.build_parser`` calls :func:`add_commands` on its subparsers. Every command function
has the contract of ``seqcls.cli``'s own: ``(args) -> (exit code, printer)``, run while stdout is
routed to stderr, the printer called afterwards to write the results to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["add_commands"]


def _cmd_demo_checkpoint(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    if args.tiny:
        from seqcls_tools.testing import build_tiny_checkpoint

        path = build_tiny_checkpoint(args.out, seed=args.seed, logit_scale=300.0)
        return 0, lambda: print(f"checkpoint: {path} (tiny, random weights)")
    from seqcls_tools.demo.train import train_demo_checkpoint

    result = train_demo_checkpoint(args.out, seed=args.seed, quick=args.quick)
    return 0, lambda: print(
        f"checkpoint: {result.path} (trained {result.epochs} epochs in {result.seconds:.0f}s; held-out "
        f"micro-F1 {result.micro_f1:.3f}, macro-F1 {result.macro_f1:.3f})"
    )


def _cmd_demo(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    from seqcls_tools.demo.run import report, run_demo

    result = run_demo(keep_servers=args.keep_servers, quick=args.quick)
    return 0, lambda: print(report(result))


def _cmd_airflow_ui(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    """Airflow's components and the local Triton until Ctrl-C (or SIGTERM), which ends only what this
    started: a Triton that was already running (``seqcls triton start``, a kept demo) keeps running."""
    import signal

    from seqcls.localtriton import LocalTriton, TritonServerConfig
    from seqcls.settings import Settings
    from seqcls_tools.demo.run import demo_dir
    from seqcls_tools.demo.stack import USER, AirflowStack

    root = demo_dir()
    settings = Settings.from_env(home=Path(os.environ.get("SEQCLS_HOME") or root / "home"))
    triton = LocalTriton(TritonServerConfig.from_settings(settings))
    was_running = triton.status().running
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with triton:  # stops the server on exit only if this call started it
            stack = AirflowStack(root, settings, port=args.port, password=args.password)
            try:
                stack.start()
                _until_interrupted(
                    f"Airflow UI: {stack.url}  (user {USER}, password {stack.password}); DAG seqcls_release — "
                    f"trigger it with a checkpoint directory. Triton gRPC {settings.triton_grpc[0]}"
                    + (" (already running: left running at exit)" if was_running else "")
                    + ". Ctrl-C stops what this started."
                )
            finally:
                stack.stop()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    left = triton.status().running
    return 0, lambda: print(
        "stopped: the Airflow components"
        + ("; the local Triton was already running: left running" if left else " and the local Triton")
    )


def _cmd_team_registry(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    """The compose file's MLflow server (PostgreSQL store, basic auth, proxied artifacts) as local processes
    until Ctrl-C (or SIGTERM); both are throwaway: their data is removed at exit."""
    import signal
    import tempfile

    from seqcls_tools.teamstack import MlflowServer, Postgres

    previous = signal.signal(signal.SIGTERM, _interrupt)
    pg = Postgres()
    try:
        pg.start()
        with tempfile.TemporaryDirectory(prefix="seqcls-team-registry-") as root:
            server = MlflowServer(pg, Path(root)).prepare()
            try:
                server.start()
                exports = " ".join(f"{k}={v}" for k, v in server.client_env().items())
                _until_interrupted(
                    f"MLflow (compose service mlflow) on {server.url}, PostgreSQL on 127.0.0.1:{pg.port} "
                    f"(data in {pg.root}); for the seqcls CLI in another shell:\n  export {exports}\n"
                    "Ctrl-C stops both and removes their data."
                )
            finally:
                server.kill()
    except KeyboardInterrupt:
        pass
    finally:
        pg.stop()
        signal.signal(signal.SIGTERM, previous)
    return 0, lambda: print("stopped: the MLflow server and PostgreSQL (their data removed)")


def _cmd_team_stack(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    """The compose file's whole stack as local processes (PostgreSQL, MLflow server, Redis, Triton, Airflow
    with the CeleryExecutor and its workers, or ``--executor local``) until Ctrl-C (or SIGTERM); throwaway unless
    ``--root``."""
    import signal
    import tempfile

    from seqcls_tools.teamstack import TeamStack

    previous = signal.signal(signal.SIGTERM, _interrupt)
    with contextlib.ExitStack() as cleanup:
        root = args.root or Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="seqcls-team-stack-")))
        stack = TeamStack(
            Path(root),
            models_file=args.models_file,
            password=args.password,
            tritons=args.tritons,
            prometheus=not args.no_prometheus,
            executor=args.executor,
        )
        try:
            stack.start()
            assert stack.airflow is not None and stack.settings is not None
            exports = " ".join(f"{k}={v}" for k, v in stack.cli_env().items())
            _until_interrupted(
                f"Airflow ({stack.airflow.executor}, {stack.airflow.workers} workers) {stack.airflow.url}  "
                f"(user admin, password {stack.airflow.stack.password}); MLflow {stack.mlflow.url}; "
                f"Triton gRPC {','.join(stack.settings.triton_grpc)}; "
                + (f"Prometheus {stack.prometheus.url}; " if stack.prometheus else "")
                + f"checkpoints root {stack.settings.checkpoints_root}; "
                f"logs {stack.airflow.stack.logs}.\nFor the seqcls CLI in another shell:\n  export {exports}\n"
                "Ctrl-C stops everything" + ("." if args.root else " and removes its data.")
            )
        except KeyboardInterrupt:
            pass
        finally:
            stack.stop()
            signal.signal(signal.SIGTERM, previous)
    parts = ["Airflow", *(["its workers", "Redis"] if args.executor == "celery" else [])]
    parts += [*(["Prometheus"] if not args.no_prometheus else []), "the Tritons", "the MLflow server and PostgreSQL"]
    stopped = "stopped: " + ", ".join(parts)
    return 0, lambda: print(stopped)


def _until_interrupted(message: str) -> None:
    """Say what runs and how to stop it, then wait for Ctrl-C (SIGTERM is turned into it by the caller)."""
    import time

    print(message, file=sys.stderr, flush=True)
    while True:
        time.sleep(1)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _cmd_bench(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    from seqcls_tools import bench

    return bench.run_from_args(args)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``demo``, ``airflow-ui``, ``team-registry``, ``bench`` and ``demo-checkpoint`` on ``seqcls``'s
    subparsers."""
    from seqcls_tools import bench

    p = sub.add_parser("demo", help="the main job: train the demo model, release it through the Airflow DAG")
    p.add_argument("--keep-servers", action="store_true", help="leave the local Triton running afterwards")
    p.add_argument("--quick", action="store_true", help="train the demo model briefly (~25 s)")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("airflow-ui", help="run the Airflow UI + scheduler + local Triton on 127.0.0.1 until Ctrl-C")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--password", default=None, help="password of user admin (default: generated once per Airflow home, printed)"
    )
    p.set_defaults(func=_cmd_airflow_ui)
    p = sub.add_parser(
        "team-registry",
        help="run the compose file's MLflow server on a throwaway PostgreSQL (basic auth) on 127.0.0.1 until Ctrl-C",
    )
    p.set_defaults(func=_cmd_team_registry)
    p = sub.add_parser(
        "team-stack",
        help="run the compose file's services (PostgreSQL, MLflow, Redis, Tritons, Prometheus, Airflow on Celery) on "
        "127.0.0.1 "
        "until Ctrl-C",
    )
    p.add_argument("--root", type=Path, default=None, help="keep everything here (default: a throwaway directory)")
    p.add_argument("--models-file", type=Path, default=None, help="the release DAGs' models file (default: none)")
    p.add_argument("--password", default=None, help="password of the Airflow user admin (default: generated)")
    p.add_argument("--tritons", type=int, default=3, help="Triton replicas on the shared repository (default 3)")
    p.add_argument("--no-prometheus", action="store_true", help="no Prometheus scraping the Tritons")
    p.add_argument(
        "--executor",
        choices=("celery", "local"),
        default="celery",
        help="celery: the compose file's CeleryExecutor, Redis and workers (default); local: its documented "
        "LocalExecutor variant (the scheduler runs the tasks; no broker, no worker)",
    )
    p.set_defaults(func=_cmd_team_stack)
    p = sub.add_parser("bench", help="benchmark every serving profile on a real local Triton (see docs/performance.md)")
    p.add_argument("--home", type=Path, default=None)
    p.set_defaults(func=_cmd_bench, bench_parser=p)
    bench.add_arguments(p)
    p = sub.add_parser("demo-checkpoint", help="train the demo classifier (bundled dataset, ~2 min on 2 CPU cores)")
    p.add_argument("out", type=Path, help="directory to write the checkpoint to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="train briefly (~25 s; lower F1)")
    p.add_argument("--tiny", action="store_true", help="no training: a tiny random model (for plumbing tests)")
    p.set_defaults(func=_cmd_demo_checkpoint)
