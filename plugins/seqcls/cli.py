"""``seqcls <step>``: every release step without Airflow.

Each command prints the release workspace and a one-line outcome and exits 0 on success; on a
failure it prints the reason and exits 1 (2 for usage errors). ``--json`` prints the step
results as JSON instead, for scripts. The step subcommands, their order and help come from the
step table (:mod:`seqcls.steps`), the release flags from :mod:`seqcls.config`; the development
tools (demo, bench, airflow-ui, demo-checkpoint) are registered by ``seqcls_tools`` when installed.
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

Printer = Callable[[], None]


def _add_release_args(p: argparse.ArgumentParser) -> None:
    from seqcls import config

    p.add_argument("--checkpoint", required=True, help="checkpoint directory (save_pretrained output + label.txt)")
    p.add_argument("--home", type=Path, default=None, help="release home (default: $SEQCLS_HOME or ~/.seqcls)")
    p.add_argument("--label-file", type=Path, default=None, help="label file (default: <checkpoint>/label.txt)")
    p.add_argument("--golden-file", type=Path, default=None, help="golden texts (default: <checkpoint>/golden.txt)")
    config.add_arguments(p)
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
    from seqcls.config import config_from_args
    from seqcls.settings import Settings
    from seqcls.workspace import open_release

    settings = Settings.from_env(home=args.home, triton_grpc=tuple(args.grpc) if args.grpc else None)
    return open_release(
        args.checkpoint, config_from_args(args), settings, label_file=args.label_file, golden_file=args.golden_file
    )


def _print_results(args: argparse.Namespace, workspace: Path, results: list) -> None:
    if getattr(args, "json", False):
        payload = {"workspace": str(workspace), "results": [r.to_dict() for r in results]}
        print(json.dumps(payload, indent=2, ensure_ascii=False, default=str))
        return
    print(f"workspace: {workspace}")
    for r in results:
        print(r.line())


def _cmd_step(args: argparse.Namespace) -> tuple[int, Printer]:
    from seqcls.steps import step

    release = _release_from_args(args)
    result = step(args.command)(release)
    return 0, lambda: _print_results(args, release.workspace.root, [result])


def _cmd_release(args: argparse.Namespace) -> tuple[int, Printer]:
    from seqcls.steps import run_release

    release = _release_from_args(args)
    results = run_release(release, until=args.until)
    return 0, lambda: _print_results(args, release.workspace.root, results)


def _cmd_triton(args: argparse.Namespace) -> tuple[int, Printer]:
    from seqcls.localtriton import LocalTriton, TritonServerConfig
    from seqcls.settings import Settings

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


def _add_tools(sub: argparse._SubParsersAction) -> None:
    """The development tools' subcommands, when ``seqcls_tools`` is installed (a checkout's ``pip install -e .``)."""
    try:
        from seqcls_tools.cli import add_commands
    except ModuleNotFoundError as exc:
        if exc.name != "seqcls_tools":
            raise
        return
    add_commands(sub)


def build_parser() -> argparse.ArgumentParser:
    from seqcls.steps import EXTRA_STEPS, ORDER, STEPS

    parser = argparse.ArgumentParser(prog="seqcls", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for s in (*STEPS, *EXTRA_STEPS):
        p = sub.add_parser(s.name, help=s.help)
        _add_release_args(p)
        p.set_defaults(func=_cmd_step)
    p = sub.add_parser("release", help=f"run every step in order ({' → '.join(ORDER)}), skipping those already done")
    _add_release_args(p)
    p.add_argument("--until", choices=list(ORDER), default=None, help="stop after this step")
    p.set_defaults(func=_cmd_release)
    p = sub.add_parser("triton", help="the local Triton server (nvidia-pytriton's tritonserver, loopback)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--home", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_triton)
    _add_tools(sub)
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
