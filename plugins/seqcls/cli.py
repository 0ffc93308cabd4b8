"""``seqcls <step>``: every release step without Airflow.

Each command prints the release workspace and a one-line outcome. Exit codes: 0 success; 1 the
command failed (the reason is printed: bad input, a failed gate or smoke, Triton or MLflow
unreachable) — ``status`` also exits 1 when the recorded state, the endpoints and MLflow disagree,
``sync`` when something did not converge; 2 usage error (argparse); 3 ``triton status``: the local
server is not live. ``monitor``: 0 no drift, 1 drift, 2 bad input / no replica answered / no
reference recorded, 3 not enough traffic to judge. ``--json`` prints the results as JSON instead, for scripts. The step
subcommands, their order and help come from the step table (:mod:`seqcls.steps`), the release
flags from :mod:`seqcls.config`; the development tools (demo, bench, airflow-ui, demo-checkpoint)
are registered by ``seqcls_tools`` when installed.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from seqcls import __version__, config
from seqcls.contract.names import ModelName
from seqcls.errors import InputError, SeqclsError
from seqcls.localtriton import LocalTriton
from seqcls.monitoring.drift import DRIFT, NOT_ENOUGH, Thresholds
from seqcls.monitoring.live import monitor
from seqcls.notify.commands import notify_outcome
from seqcls.ops.gc import GC_HELP, after_promote, gc
from seqcls.ops.gc import add_arguments as add_gc_arguments
from seqcls.ops.history import history as serving_history
from seqcls.ops.history import lines as history_lines
from seqcls.ops.localserver import local_triton_config
from seqcls.ops.replica import HELP as REPLICA_HELP
from seqcls.ops.replica import add_arguments as add_replica_arguments
from seqcls.ops.replica import replica_ready, replica_url
from seqcls.ops.status import status
from seqcls.ops.sync import sync
from seqcls.registry.ledger import version_label
from seqcls.release.completion import find_latest, mark_complete, read_marker
from seqcls.release.intake import open_release
from seqcls.release.kept import OWN_EVAL_FILES, preflight_eval_set
from seqcls.release.records import EVALUATION
from seqcls.serving.layout import calibrate_layout
from seqcls.serving.lease import ReleaseLease
from seqcls.settings import DEFAULT_MODEL_NAME, Settings
from seqcls.steps import EXTRA_STEPS, ORDER, STEPS, run_release, step
from seqcls.steps.preflight import preflight, servers_for
from seqcls.steps.rollback import rollback_model

log = logging.getLogger("seqcls")

Printer = Callable[[], None]


def _add_ops_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", type=Path, default=None, help="release home (default: $SEQCLS_HOME or ~/.seqcls)")
    p.add_argument("--grpc", action="append", default=None, metavar="HOST:PORT", help="Triton gRPC endpoint (repeat)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _add_release_args(p: argparse.ArgumentParser, *, checkpoint_required: bool = True, reason: bool = True) -> None:
    p.add_argument(
        "--checkpoint",
        required=checkpoint_required,
        help="checkpoint directory (save_pretrained output + label.txt)",
    )
    p.add_argument("--home", type=Path, default=None, help="release home (default: $SEQCLS_HOME or ~/.seqcls)")
    p.add_argument("--label-file", type=Path, default=None, help="label file (default: <checkpoint>/label.txt)")
    p.add_argument("--golden-file", type=Path, default=None, help="golden texts (default: <checkpoint>/golden.txt)")
    config.add_arguments(p)
    if reason:  # rollback's own --reason is why it rolls back
        p.add_argument("--reason", dest="override_reason", default=None, help="the same as --override-reason")
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
    settings = Settings.from_env(home=args.home, triton_grpc=tuple(args.grpc) if args.grpc else None)
    cfg = config.config_from_args(args)
    return open_release(args.checkpoint, cfg, settings, label_file=args.label_file, golden_file=args.golden_file)


def _print_results(args: argparse.Namespace, workspace: Path, results: list) -> None:
    if getattr(args, "json", False):
        payload = {"workspace": str(workspace), "results": [r.to_dict() for r in results]}
        print(json.dumps(payload, indent=2, ensure_ascii=False, default=str))
        return
    print(f"workspace: {workspace}")
    for r in results:
        print(r.line())


def _ops_settings(args: argparse.Namespace):
    return Settings.from_env(home=args.home, triton_grpc=tuple(args.grpc) if getattr(args, "grpc", None) else None)


def _cmd_status(args: argparse.Namespace) -> tuple[int, Printer]:
    reports = status(_ops_settings(args), [args.model_name] if args.model_name else None)
    code = 0 if all(r.agree for r in reports) else 1  # nothing released: nothing served, nothing to disagree

    def show() -> None:
        if args.json:
            print(json.dumps([r.to_dict() for r in reports], indent=2, ensure_ascii=False, default=str))
        elif not reports:
            print("no model has a recorded serving state in this repository (nothing released yet)")
        for r in reports if not args.json else ():
            print("\n".join(r.lines()))

    return code, show


def _cmd_history(args: argparse.Namespace) -> tuple[int, Printer]:
    if args.limit is not None and args.limit < 1:
        return 2, lambda: print(f"error: --limit must be 1 or more, got {args.limit}", file=sys.stderr)
    try:
        names = [args.model_name] if args.model_name else None
        result = serving_history(_ops_settings(args), names, limit=args.limit)  # cut before the MLflow join
    except InputError as exc:  # a model name that cannot exist: a usage error
        message = f"error: {exc}"
        return 2, lambda: print(message, file=sys.stderr)

    def show() -> None:
        if args.json:
            print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False, default=str))
        else:
            print("\n".join(history_lines(result, args.limit)))

    return 0, show


def _cmd_sync(args: argparse.Namespace) -> tuple[int, Printer]:
    results = sync(_ops_settings(args), [args.model_name] if args.model_name else None)
    code = 0 if all(r.ok for r in results) else 1

    def show() -> None:
        if args.json:
            print(json.dumps([r.to_dict() for r in results], indent=2, ensure_ascii=False, default=str))
            return
        for r in results:
            state = (
                "in sync" if r.ok else "NOT in sync: " + "; ".join([*r.errors.values(), r.registry.get("error", "")])
            )
            print(f"{r.model_name}: serving {r.serving}, {len(r.actions)} action(s), {state}")
        if not results:
            print("nothing to sync: no model has a recorded serving state")

    return code, show


def _cmd_replica_ready(args: argparse.Namespace) -> tuple[int, Printer]:
    """Exit 0 when the replica serves every model's recorded version (a probe's answer), else 1."""
    settings = Settings.from_env(home=args.home)
    names = [args.model_name] if args.model_name else None
    url = replica_url(args.url, settings)
    result = replica_ready(settings, url, model_names=names, reconcile=args.reconcile, timeout=args.timeout)
    text = json.dumps(result.to_dict(), indent=2, default=str) if args.json else "\n".join(result.lines())
    return (0 if result.ready else 1), lambda: print(text)


def _cmd_gc(args: argparse.Namespace) -> tuple[int, Printer]:
    """Dry run unless ``--apply``; exit 1 when a model was left alone (its lease held, MLflow unreadable)."""
    names = [args.model_name] if args.model_name else None
    result = gc(
        _ops_settings(args),
        names,
        apply=args.apply,
        keep_refused=args.keep_refused,
        mlflow_versions=args.mlflow_versions,
        evidence_keep=args.evidence_keep,
        statelog_rotate_bytes=args.statelog_rotate_bytes,
    )
    text = json.dumps(result.to_dict(), indent=2, default=str) if args.json else "\n".join(result.lines())
    return (0 if result.ok else 1), lambda: print(text)


def _cmd_lease(args: argparse.Namespace) -> tuple[int, Printer]:
    import getpass

    settings = _ops_settings(args)
    lease = ReleaseLease(settings.triton_repository, args.model_name)
    removed = lease.break_lease(f"cli:{getpass.getuser()}", args.reason)
    if args.json:
        payload = {"model_name": args.model_name, "broken": removed.describe() if removed else None}
        return 0, lambda: print(json.dumps(payload, indent=2))
    return 0, lambda: print(
        f"lease of {args.model_name}: " + (f"broken (was {removed.describe()})" if removed else "was free")
    )


def _cmd_rollback(args: argparse.Namespace) -> tuple[int, Printer]:
    """``--checkpoint X``: that release (in flight or served); ``--model-name`` alone: the served model."""
    if args.checkpoint:
        return _cmd_step(args)
    if not args.model_name:
        raise InputError("rollback needs --model-name NAME (serve its previous version) or --checkpoint DIR")
    model = ModelName(args.model_name)  # the release flags' --model-name: checked here, where it enters
    result = rollback_model(_ops_settings(args), model, reason=args.reason or "requested from the CLI")
    return 0, lambda: print(
        json.dumps(result, indent=2, default=str)
        if args.json
        else f"rollback: {args.model_name} serves Triton v{result['serving_version']} again "
        f"(was Triton v{result['from']})"
    )


def _cmd_calibrate_layout(args: argparse.Namespace) -> tuple[int, Printer]:
    low, _, high = args.lengths.partition("-")
    if not (low.isdigit() and high.isdigit()):
        raise InputError(f"--lengths {args.lengths!r}: expected MIN-MAX tokens, e.g. 16-64")
    layouts = [x.strip() for x in args.layouts.split(",")] if args.layouts else None
    cal = calibrate_layout(
        _ops_settings(args),
        args.model_name,
        layouts=layouts,
        cores=args.cores,
        clients=args.clients,
        seconds=args.seconds,
        lengths=(int(low), int(high)),
    )
    return 0, lambda: print(json.dumps(cal.to_dict(), indent=2) if args.json else "\n".join(cal.lines()))


def _cmd_checkpoint(args: argparse.Namespace) -> tuple[int, Printer]:
    """``mark-complete DIR``: the training job's last step; ``latest [ROOT]``: what 'latest' resolves to."""
    if args.action == "mark-complete":
        if args.path is None:
            raise InputError("checkpoint mark-complete needs the checkpoint directory")
        done = mark_complete(args.path, run=args.run)
    else:
        done = read_marker(find_latest(args.path or Settings.from_env(home=args.home).checkpoints_root))
    payload = {"checkpoint": str(done.path), "marker": str(done.marker), **json.loads(done.to_json())}
    if args.json:
        return 0, lambda: print(json.dumps(payload, indent=2, ensure_ascii=False))
    fp = (done.fingerprint or "-")[:16]
    return 0, lambda: print(f"{done.path}: complete at {payload['completed_at']} (fingerprint {fp}, run {done.run})")


def _cmd_step(args: argparse.Namespace) -> tuple[int, Printer]:
    release = _release_from_args(args)
    kwargs = {"reason": args.reason or "requested from the CLI"} if args.command == "rollback" else {}
    result = step(args.command)(release, **kwargs)
    if args.command == "promote" and not result.summary.get("already"):
        after_promote(release)  # retention: logged, never this command's failure
    return 0, lambda: _print_results(args, release.workspace.root, [result])


def _cmd_evaluate(args: argparse.Namespace) -> tuple[int, Printer]:
    """The quality gate alone: the steps before it (skipped when done), then evaluate. Exit 0 passed,
    1 refused (or an earlier gate failed), 2 bad input (the eval set, a param, the checkpoint)."""
    error: SeqclsError | None = None
    current = ""
    try:
        release = _release_from_args(args)
        if preflight_eval_set(release) is None:
            raise InputError(
                "no eval set: give --eval-set FILE (PaddleNLP's text<TAB>label,label or JSONL "
                f'{{"text", "labels"}}), or put one of {", ".join(OWN_EVAL_FILES)} in the checkpoint'
            )
        for s in STEPS[: ORDER.index("evaluate") + 1]:
            current = s.name
            s(release)
    except InputError as exc:
        message = f"error: {exc}"
        return 2, lambda: print(message, file=sys.stderr)
    except SeqclsError as exc:  # a refusal, or a failed export/convert/parity gate before it
        error = exc
    ws = release.workspace
    path = ws.path(EVALUATION) if error is None else ws.failed_dir("evaluate") / "evaluation.json"
    ran = current == "evaluate" and path.is_file()  # an earlier step's failure: no verdict to show
    evaluation = json.loads(path.read_text(encoding="utf-8")) if ran else None

    def show() -> None:
        if args.json and evaluation is not None:
            print(json.dumps(evaluation, indent=2, ensure_ascii=False))
        elif evaluation is not None:
            print(f"workspace: {ws.root}")
            print(f"evaluate: {evaluation.get('summary', '')}")
            for who in ("candidate", "champion", "fp32"):
                sc = evaluation.get(who)
                if sc:
                    where = f" (Triton v{evaluation['champion_version']})" if who == "champion" else ""
                    print(
                        f"  {who}{where}: micro-F1 {sc['micro_f1']:.4f}, macro-F1 {sc['macro_f1']:.4f}, "
                        f"sample accuracy {sc['sample_accuracy']:.4f}"
                    )
            print(f"  evidence: {path.parent if path else ws.root}")
        if error is not None:
            print(f"error: {error}", file=sys.stderr)

    return (1 if error is not None else 0), show


def _cmd_release(args: argparse.Namespace) -> tuple[int, Printer]:
    t0 = time.perf_counter()
    try:
        release = _release_from_args(args)
        # params, eval set, and the servers when the release goes that far: fails now, not after export
        preflight(release, servers=servers_for(args.until))
    except InputError as exc:  # the user's input: exit 2 like a usage error, no traceback
        message = f"error: {exc}"
        return 2, lambda: print(message, file=sys.stderr)
    resolved = time.perf_counter() - t0
    results = run_release(release, until=args.until)
    if any(r.step == "promote" and not r.summary.get("already") for r in results):
        # retention after a champion move (logged, never the release's failure); a release of the champion
        # again moved nothing, and a gc's cost grows with the registry: it is not paid for nothing
        after_promote(release)
    total = time.perf_counter() - t0

    def show() -> None:
        _print_results(args, release.workspace.root, results)
        if not args.json:
            print(_release_line(release, results, resolved, total))

    return 0, show


def _release_line(release, results: list, resolved: float, total: float) -> str:
    """The last line of a release: what is served now, where — and where the time went."""
    steps = sum(r.seconds for r in results)
    took = (
        f"{total:.1f}s: steps {steps:.1f}s, resolve + preflight {resolved:.1f}s, the rest "
        f"{max(total - steps - resolved, 0.0):.1f}s (library imports, lease and workspace locks, records)"
    )
    done = {r.step: r for r in results}
    promoted = done.get("promote")
    if promoted is None:
        return f"{release.config.model_name}: stopped after {results[-1].step if results else 'resolve'} in {took}"
    summary = promoted.summary
    where = ", ".join(release.settings.triton_grpc)
    served = version_label(summary.get("triton_version"), summary.get("version"))
    return f"{release.config.model_name}: serving {served} at {where} (gRPC) — release took {took}"


def _cmd_monitor(args: argparse.Namespace) -> tuple[int, Printer]:
    """Exit 0 no drift, 1 drift, 2 bad input / no replica answered / no reference, 3 not enough traffic."""
    try:
        metrics = tuple(args.metrics) if args.metrics else None
        settings = Settings.from_env(home=args.home, triton_metrics=metrics)
        thresholds = Thresholds(psi=args.psi, alpha=args.alpha, min_texts=args.min_texts)
        model = ModelName(args.model_name)  # a bad name is bad input here: exit 2, as below
        report = monitor(settings, model, args.since, thresholds=thresholds, prometheus=args.prometheus)
    except SeqclsError as exc:
        message = f"error: {exc}"
        return 2, lambda: print(message, file=sys.stderr)
    code = {DRIFT: 1, NOT_ENOUGH: 3}.get(report.state, 0)
    if args.json:
        return code, lambda: print(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    return code, lambda: print("\n".join(report.lines()))


def _cmd_triton(args: argparse.Namespace) -> tuple[int, Printer]:
    settings = Settings.from_env(home=args.home)
    server = LocalTriton(local_triton_config(settings))
    synced = []
    if args.action == "start":
        server_status = server.start()
        if server_status.live:  # explicit mode starts empty: serve what is recorded, by itself
            synced = sync(settings)  # one model's damage is reported; the others are loaded
    elif args.action == "stop":
        server.stop()
        server_status = server.status()
    else:
        server_status = server.status()
    data = server_status.to_dict()
    not_synced = [r for r in synced if r.errors]  # what is served; an MLflow outage is `seqcls sync`'s to report
    data["sync"] = [r.to_dict() for r in synced]
    code = 0 if args.action == "stop" or data.get("live") else 3
    code = 1 if code == 0 and not_synced else code

    def show() -> None:
        if args.json:
            print(json.dumps(data, indent=2, default=str))
        else:
            state = "live" if data.get("live") else ("running" if data.get("running") else "not running")
            print(
                f"triton: {state} (pid {data.get('pid')}) gRPC {data.get('grpc_url')} HTTP {data.get('http_url')}"
                f" repository {data.get('repository')} log {data.get('log_path')}"
            )
            for r in not_synced:
                print(f"{r.model_name}: NOT served as recorded: " + "; ".join(r.errors.values()))

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


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("seqcls")
    except PackageNotFoundError:  # a source tree without `pip install -e .`
        return __version__


class _Parser(argparse.ArgumentParser):
    """argparse that answers a mistyped command with the closest one ("did you mean ...?")."""

    def error(self, message: str):  # type: ignore[override]
        if "invalid choice:" in message and "choose from" in message:
            typed = message.split("invalid choice:", 1)[1].split("(", 1)[0].strip(" '\"")
            choices = [c.strip(" '\"") for c in message.split("choose from", 1)[1].strip(" )").split(",")]
            close = difflib.get_close_matches(typed, choices, n=1)
            if close:
                message = f"{message}; did you mean {close[0]!r}?"
        super().error(message)


def _did_you_mean(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """For each unknown ``--option`` the closest option of ``parser`` (the subcommand's)."""
    options = [o for action in parser._actions for o in action.option_strings]
    hints = []
    for word in extras:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], options, n=1)
            if close:
                hints.append(f"{word}: did you mean {close[0]}?")
    return f" ({'; '.join(hints)})" if hints else ""


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def _add_history_parser(sub) -> None:
    p = sub.add_parser(
        "history",
        help="every serving change (release, expose, refusal, rollback, sync repair): when, who, from → to "
        "(Triton and MLflow versions), fingerprint, gates, reason; newest last",
    )
    p.add_argument("--model-name", default=None, help="one model (default: every model with a recorded state)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the newest N changes")
    _add_ops_args(p)
    p.set_defaults(func=_cmd_history)


def _add_status_sync_parsers(sub) -> None:
    for name, func, text in (
        (
            "status",
            _cmd_status,
            "recorded serving state vs every endpoint vs MLflow, lease holder; exit 1 if they differ",
        ),
        ("sync", _cmd_sync, "make every endpoint (and MLflow's champion) match the recorded state; safe any time"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument(
            "--model-name", type=ModelName, default=None, help="one model (default: every model with a recorded state)"
        )
        _add_ops_args(p)
        p.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="seqcls", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"seqcls {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for s in (*STEPS, *EXTRA_STEPS):
        p = sub.add_parser(s.name, help=s.help)
        _add_release_args(p, checkpoint_required=s.name != "rollback", reason=s.name != "rollback")
        p.set_defaults(func={"rollback": _cmd_rollback, "evaluate": _cmd_evaluate}.get(s.name, _cmd_step))
        if s.name == "rollback":
            p.add_argument("--reason", default=None, help="why (recorded in the serving history)")
    _add_status_sync_parsers(sub)
    _add_history_parser(sub)
    p = sub.add_parser("replica-ready", help=REPLICA_HELP)
    add_replica_arguments(p)
    p.set_defaults(func=_cmd_replica_ready)
    p = sub.add_parser("gc", help=GC_HELP)
    add_gc_arguments(p)
    _add_ops_args(p)
    p.set_defaults(func=_cmd_gc)
    p = sub.add_parser("lease", help="the per-model release lease: `lease break` removes a stuck one")
    p.add_argument("action", choices=["break"])
    p.add_argument("--model-name", type=ModelName, required=True)
    p.add_argument("--reason", default="broken by an operator")
    _add_ops_args(p)
    p.set_defaults(func=_cmd_lease)
    p = sub.add_parser(
        "calibrate-layout",
        help="time each instances x threads layout of a model's candidate (else served) version on the target "
        "Triton, as a throwaway model no client is routed to; prints the SEQCLS_SERVING_LAYOUT to set",
    )
    p.add_argument("--model-name", type=ModelName, default=DEFAULT_MODEL_NAME)
    p.add_argument("--layouts", default=None, help="comma-separated IxT (default: every split of --cores)")
    p.add_argument("--cores", type=int, default=None, help="the Triton host's cores (default: this host's)")
    p.add_argument("--clients", type=int, default=8, help="concurrent single-text clients (default 8)")
    p.add_argument("--seconds", type=float, default=5.0, help="per layout and phase (default 5)")
    p.add_argument("--lengths", default="16-64", help="token lengths of the synthetic texts (default 16-64)")
    _add_ops_args(p)
    p.set_defaults(func=_cmd_calibrate_layout)
    p = sub.add_parser(
        "monitor",
        help="compare the served version's live label shares (Triton's metrics, every replica) with its release's "
        "reference; exit 0 no drift, 1 drift, 2 error, 3 not enough traffic",
    )
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME)
    p.add_argument("--since", default=None, help="window, e.g. 30m, 1h, 2d (default: since each replica loaded it)")
    p.add_argument("--min-texts", type=int, default=Thresholds.min_texts, help="live texts before judging (200)")
    p.add_argument("--psi", type=float, default=Thresholds.psi, help="PSI from which a shift is large (0.1)")
    p.add_argument("--alpha", type=float, default=Thresholds.alpha, help="significance level (0.001)")
    p.add_argument("--metrics", action="append", default=None, metavar="HOST:PORT", help="Triton metrics (repeat)")
    p.add_argument("--prometheus", default=None, metavar="URL", help="Prometheus for --since ($SEQCLS_PROMETHEUS_URL)")
    p.add_argument("--home", type=Path, default=None, help="release home (default: $SEQCLS_HOME or ~/.seqcls)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_monitor)
    p = sub.add_parser("release", help=f"run every step in order ({' → '.join(ORDER)}), skipping those already done")
    _add_release_args(p)
    p.add_argument("--until", choices=list(ORDER), default=None, help="stop after this step")
    p.set_defaults(func=_cmd_release)
    p = sub.add_parser("triton", help="the local Triton server (nvidia-pytriton's tritonserver, loopback)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--home", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_triton)
    p = sub.add_parser(
        "checkpoint",
        help="`checkpoint mark-complete DIR` (the training job's last step: writes SEQCLS_DONE.json); "
        "`checkpoint latest [ROOT]` (what 'latest' resolves to)",
    )
    p.add_argument("action", choices=["mark-complete", "latest"])
    p.add_argument("path", type=Path, nargs="?", default=None, help="the checkpoint (mark-complete) or root (latest)")
    p.add_argument("--run", default=None, help="mark-complete: the training run's id, recorded in the marker")
    p.add_argument("--home", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_checkpoint)
    _add_tools(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:  # a flag's own type may refuse its value (a model name: InputError, exit 1 like any bad input)
        args, extras = parser.parse_known_args(argv)
    except SeqclsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if extras:  # argparse's own message, with the closest option of the command that was typed
        sub = _subparser(parser, getattr(args, "command", None))
        sub.error(f"unrecognized arguments: {' '.join(extras)}{_did_you_mean(sub, extras)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        with stdout_to_stderr():
            code, printer = notify_outcome(args.func, args)  # release/rollback: outcome to SEQCLS_NOTIFY_URLS
        printer()
        return code
    except SeqclsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
