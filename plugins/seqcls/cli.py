"""``seqcls <step>``: every release step without Airflow.

Each command prints the release workspace and a one-line outcome and exits 0 on success; on a
failure it prints the reason and exits 1 (2 for usage errors). ``--json`` prints the step
results as JSON instead, for scripts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from seqcls.errors import SeqclsError

log = logging.getLogger("seqcls")


def _add_release_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (save_pretrained output + label.txt)")
    p.add_argument("--model-name", default=None, help="registered/served model name (default: seqcls)")
    p.add_argument("--home", type=Path, default=None, help="release home (default: $SEQCLS_HOME or ~/.seqcls)")
    p.add_argument("--label-file", type=Path, default=None, help="label file (default: <checkpoint>/label.txt)")
    p.add_argument("--golden-file", type=Path, default=None, help="golden texts (default: <checkpoint>/golden.txt)")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default 14)")
    p.add_argument("--max-length", type=int, default=None, help="tokenizer max_length (default 128)")
    p.add_argument("--threshold", type=float, default=None, help="global decision threshold (default 0.5)")
    p.add_argument("--thresholds", default=None, help="per-label thresholds as JSON, e.g. '{\"体育##夺冠\": 0.6}'")
    p.add_argument("--atol", type=float, default=None, help="logits absolute tolerance (default 1e-4)")
    p.add_argument("--rtol", type=float, default=None, help="logits relative tolerance (default 1e-3)")
    p.add_argument(
        "--provider",
        choices=["auto", "cpu", "cuda"],
        default=None,
        help="ONNX Runtime provider for the parity gate (default auto)",
    )
    p.add_argument("--require-gpu", action="store_true", default=None, help="fail when no CUDA provider is available")
    p.add_argument("--profile", choices=["fp32", "fp32-fused", "int8"], default=None, help="serving profile")
    p.add_argument(
        "--grpc",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help="Triton gRPC endpoint (repeat for replicas; default $SEQCLS_TRITON_GRPC or 127.0.0.1:8001)",
    )
    p.add_argument("--json", action="store_true", help="print results as JSON")


@contextlib.contextmanager
def stdout_to_stderr():
    """Route fd 1 to stderr while steps run: native libraries (paddle2onnx) print there, and
    stdout must carry only the results (``--json`` is parsed by scripts)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _release_from_args(args: argparse.Namespace):
    from seqcls.config import ReleaseConfig
    from seqcls.errors import InputError
    from seqcls.settings import Settings
    from seqcls.workspace import open_release

    thresholds = None
    if args.thresholds:
        try:
            thresholds = json.loads(args.thresholds)
        except json.JSONDecodeError as exc:
            raise InputError(f"--thresholds is not valid JSON: {exc.msg}") from exc
    config = ReleaseConfig.from_dict(
        {
            "model_name": args.model_name,
            "opset": args.opset,
            "max_length": args.max_length,
            "threshold": args.threshold,
            "thresholds": thresholds,
            "atol": args.atol,
            "rtol": args.rtol,
            "provider": args.provider,
            "require_gpu": args.require_gpu,
            "profile": args.profile,
        }
    )
    settings = Settings.from_env(home=args.home, triton_grpc=tuple(args.grpc) if args.grpc else None)
    return open_release(args.checkpoint, config, settings, label_file=args.label_file, golden_file=args.golden_file)


def _print_results(args: argparse.Namespace, workspace: Path, results: list) -> None:
    if getattr(args, "json", False):
        print(
            json.dumps(
                {"workspace": str(workspace), "results": [r.to_dict() for r in results]},
                indent=2,
                ensure_ascii=False,
                default=str,
            )
        )
        return
    print(f"workspace: {workspace}")
    for r in results:
        print(r.line())


def _cmd_step(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    from seqcls.pipeline import EXTRA_STEPS, STEPS

    release = _release_from_args(args)
    result = {**STEPS, **EXTRA_STEPS}[args.command](release)
    return 0, lambda: _print_results(args, release.workspace.root, [result])


def _cmd_release(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    from seqcls.pipeline import run_release

    release = _release_from_args(args)
    results = run_release(release, until=args.until)
    return 0, lambda: _print_results(args, release.workspace.root, results)


def _cmd_demo_checkpoint(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    if args.tiny:
        from seqcls.testing import build_tiny_checkpoint

        path = build_tiny_checkpoint(args.out, seed=args.seed, logit_scale=300.0)
        return 0, lambda: print(f"checkpoint: {path} (tiny, random weights)")
    from seqcls.demo.train import train_demo_checkpoint

    result = train_demo_checkpoint(args.out, seed=args.seed, quick=args.quick)
    return 0, lambda: print(
        f"checkpoint: {result.path} (trained {result.epochs} epochs in {result.seconds:.0f}s; held-out "
        f"micro-F1 {result.micro_f1:.3f}, macro-F1 {result.macro_f1:.3f})"
    )


def _cmd_triton(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    from seqcls.settings import Settings
    from seqcls.tritonserver import LocalTriton, TritonServerConfig

    settings = Settings.from_env(home=args.home)
    server = LocalTriton(TritonServerConfig.from_settings(settings))
    if args.action == "start":
        status = server.start()
    elif args.action == "stop":
        server.stop()
        status = server.status()
    else:
        status = server.status()
    data = status.to_dict()
    code = 0 if args.action == "stop" or data.get("live") else 3

    def show() -> None:
        if args.json:
            print(json.dumps(data, indent=2, default=str))
        else:
            state = "live" if data.get("live") else ("running" if data.get("running") else "not running")
            print(
                f"triton: {state} (pid {data.get('pid')}) gRPC {data.get('grpc_url')} HTTP {data.get('http_url')}"
                f" repository {data.get('repository')} log {data.get('log_path')}"
            )

    return code, show


def _cmd_demo(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    from seqcls.demo.run import report, run_demo

    result = run_demo(keep_servers=args.keep_servers, quick=args.quick)
    return 0, lambda: print(report(result))


def _cmd_airflow_ui(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    import signal
    import time

    from seqcls.demo.run import demo_dir
    from seqcls.demo.stack import USER, AirflowStack
    from seqcls.settings import Settings
    from seqcls.tritonserver import LocalTriton, TritonServerConfig

    root = demo_dir()
    settings = Settings.from_env(home=Path(os.environ.get("SEQCLS_HOME") or root / "home"))
    triton = LocalTriton(TritonServerConfig.from_settings(settings))
    triton.start()
    stack = AirflowStack(root, settings, port=args.port, password=args.password)
    try:
        stack.start()
        print(
            f"Airflow UI: {stack.url}  (user {USER}, password {args.password}); DAG seqcls_release — trigger it "
            "with a checkpoint directory. Triton gRPC " + settings.triton_grpc[0] + ". Ctrl-C stops everything.",
            file=sys.stderr,
            flush=True,
        )
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
        triton.stop()
    return 0, lambda: print("stopped: Airflow components and the local Triton")


def _cmd_bench(args: argparse.Namespace) -> tuple[int, Callable[[], None]]:
    from seqcls import bench

    return bench.run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    from seqcls.pipeline import EXTRA_STEPS, STEPS

    parser = argparse.ArgumentParser(prog="seqcls", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    helps = {
        "export": "dygraph checkpoint → static graph",
        "convert": "static graph → ONNX (verified)",
        "validate": "parity gate: tokenizer ids, logits, decisions",
        "register": "MLflow model version with lineage, alias candidate (idempotent per fingerprint)",
        "publish": "write the release as a new immutable Triton version",
        "reload": "load the published version on every Triton endpoint (explicit mode), readiness verified",
        "smoke": "golden texts over gRPC must give the validated answers",
        "promote": "MLflow alias champion → this version (previous kept as previous-champion)",
        "rollback": "serve what was served before this release; undo its registry changes",
    }
    for name in [*STEPS, *EXTRA_STEPS]:
        p = sub.add_parser(name, help=helps.get(name, name))
        _add_release_args(p)
        p.set_defaults(func=_cmd_step)
    p = sub.add_parser("release", help="run every step in order (skipping those already done)")
    _add_release_args(p)
    p.add_argument("--until", choices=list(STEPS), default=None, help="stop after this step")
    p.set_defaults(func=_cmd_release)
    p = sub.add_parser("triton", help="the local Triton server (nvidia-pytriton's tritonserver, loopback)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--home", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_triton)
    p = sub.add_parser("demo", help="the main job: train the demo model, release it through the Airflow DAG")
    p.add_argument("--keep-servers", action="store_true", help="leave the local Triton running afterwards")
    p.add_argument("--quick", action="store_true", help="train the demo model briefly (~25 s)")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("airflow-ui", help="run the Airflow UI + scheduler + local Triton on 127.0.0.1 until Ctrl-C")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--password", default="seqcls-demo", help="password of user admin")
    p.set_defaults(func=_cmd_airflow_ui)
    p = sub.add_parser("bench", help="benchmark every serving profile on a real local Triton (see README)")
    p.add_argument("--home", type=Path, default=None)
    p.set_defaults(func=_cmd_bench, bench_parser=p)
    from seqcls import bench

    bench.add_arguments(p)
    p = sub.add_parser("demo-checkpoint", help="train the demo classifier (bundled dataset, ~2 min on 2 CPU cores)")
    p.add_argument("out", type=Path, help="directory to write the checkpoint to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="train briefly (~25 s; lower F1)")
    p.add_argument("--tiny", action="store_true", help="no training: a tiny random model (for plumbing tests)")
    p.set_defaults(func=_cmd_demo_checkpoint)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        with stdout_to_stderr():
            code, printer = args.func(args)
        printer()
        return code
    except SeqclsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
