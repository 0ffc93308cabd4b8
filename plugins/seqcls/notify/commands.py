"""``seqcls release`` and ``seqcls rollback`` tell ``SEQCLS_NOTIFY_URLS`` how they ended.

The CLI runs a command as ``code, printer = func(args)`` and prints afterwards; :func:`notify_outcome`
wraps that one call, so the commands themselves stay as they are. It notes what the model served when
the command started, then works the outcome out from what the command left: the exception it raised or
the ``error:`` line it printed, the release workspace it wrote (found by the checkpoint it was given,
touched since the command started) and the recorded serving state. The notification goes out after the
command's own output; building or sending it never changes the exit code (a warning at most).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from seqcls.errors import InputError
from seqcls.notify.delivery import check_url, send
from seqcls.notify.outcome import (
    FAILED,
    INPUT_ERRORS,
    PROMOTED,
    RESOLVE,
    ROLLED_BACK,
    UNDONE,
    Outcome,
    classify,
    error_reason,
    error_type,
    fill,
    mlflow_numbers,
    read_manifest,
    release_facts,
)
from seqcls.serving.state import current_state
from seqcls.serving.statelog import actor
from seqcls.settings import DEFAULT_MODEL_NAME, ENV_NOTIFY_URLS, Settings, notify_urls
from seqcls.steps import ORDER, UNDO_ON_FAILURE

log = logging.getLogger(__name__)

Printer = Callable[[], None]
#: The commands whose outcome is sent (the others change nothing served, or are read-only).
COMMANDS = ("release", "rollback")
ERROR_PREFIX = "error: "


def notify_outcome(func: Callable[[argparse.Namespace], tuple[int, Printer]], args: argparse.Namespace):
    """``func(args)`` — for ``release``/``rollback`` with ``SEQCLS_NOTIFY_URLS`` set, its outcome is sent
    once its output is printed (or, when it raises, before the exception goes on)."""
    command = getattr(args, "command", None)
    urls = _usable(notify_urls()) if command in COMMANDS else ()
    if not urls:
        return func(args)
    try:
        watch = Watch.start(args, urls)
    except Exception as exc:  # e.g. a bad SEQCLS_* setting: the command says so itself
        log.warning("the outcome of `seqcls %s` will not be notified: %s", command, exc)
        return func(args)
    try:
        code, printer = func(args)
    except (Exception, KeyboardInterrupt) as exc:
        watch.report(exc=exc)
        raise

    def show() -> None:
        tee = _ErrorLine(sys.stderr)
        with contextlib.redirect_stderr(tee):
            printer()
        watch.report(code=code, error=tee.error)

    return code, show


def _usable(urls: tuple[str, ...]) -> tuple[str, ...]:
    """The URLs Apprise can use; each other one a warning (a bad URL never stops a release)."""
    good = []
    for i, url in enumerate(urls):
        try:
            good.append(check_url(url, f"{ENV_NOTIFY_URLS}: URL {i + 1} of {len(urls)}"))
        except Exception as exc:  # an InputError names it; anything else Apprise raised by its type only
            why = exc if isinstance(exc, InputError) else f"{ENV_NOTIFY_URLS}: URL {i + 1}: {type(exc).__name__}"
            log.warning("%s — not notified there", why)
    return tuple(good)


class _ErrorLine(io.TextIOBase):
    """Writes through to ``stream`` and keeps the last ``error: …`` line written (what the command printed)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.error, self._line = stream, "", ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        self._line += text
        *lines, self._line = self._line.split("\n")
        for line in lines:
            if line.startswith(ERROR_PREFIX):
                self.error = line[len(ERROR_PREFIX) :]
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _now() -> str:
    """As the workspace stamps its records (UTC, seconds), so the two compare as strings."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Watch:
    """One CLI command being watched: what it was asked, when it started, what was served then."""

    command: str
    model: str
    settings: Settings
    urls: tuple[str, ...]
    started: str
    checkpoint: Path | None = None
    until: str | None = None
    reason: str = ""
    before: tuple[int | None, int | None] = (None, None)  # (serving, candidate) at the start
    who: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, args: argparse.Namespace, urls: tuple[str, ...]) -> Watch:
        checkpoint = getattr(args, "checkpoint", None)
        watch = cls(
            command=args.command,
            model=getattr(args, "model_name", None) or DEFAULT_MODEL_NAME,
            settings=Settings.from_env(home=getattr(args, "home", None)),
            urls=urls,
            started=_now(),
            checkpoint=Path(checkpoint).expanduser().resolve() if checkpoint else None,
            until=getattr(args, "until", None),
            reason=getattr(args, "reason", None) or "",
            who=actor(),
        )
        watch.before = watch.state()
        return watch

    def state(self) -> tuple[int | None, int | None]:
        try:
            s = current_state(Path(str(self.settings.triton_repository)), self.model)
            return s.serving, s.candidate
        except Exception:  # unreadable or invalid: the notification says less
            return None, None

    def report(self, *, exc: BaseException | None = None, code: int = 0, error: str = "") -> None:
        """Work the outcome out and send it; any trouble here is a warning."""
        try:
            make = self.release if self.command == "release" else self.rollback
            outcome = make(exc, code, error)
            if outcome is not None:
                outcome.user, outcome.host, outcome.via = self.who.get("user", ""), self.who.get("host", ""), self.via
                send(self.urls, outcome)
        except Exception as report_exc:
            log.warning("the outcome of `seqcls %s` was not notified: %s", self.command, report_exc)

    @property
    def via(self) -> str:
        return f"seqcls {self.command}"

    def manifest(self) -> dict[str, Any] | None:
        """This command's release workspace: of its checkpoint, written since it started (the newest)."""
        if self.checkpoint is None:
            return None
        found = []
        for path in (self.settings.releases_dir / self.model).glob("*/manifest.json"):
            m = read_manifest(path.parent)
            source = ((m or {}).get("checkpoint") or {}).get("source")
            fresh = m is not None and str(m.get("updated_at", "")) >= self.started
            if fresh and source and Path(source).resolve() == self.checkpoint:
                found.append(m)
        return max(found, key=lambda m: str(m.get("updated_at")), default=None)

    def release(self, exc: BaseException | None, code: int, error: str) -> Outcome | None:
        manifest = self.manifest()
        if exc is None and code == 0:
            if self.until not in (None, "promote"):  # stopped where asked: nothing was released yet
                return None
            outcome = Outcome(self.model, PROMOTED, previous=self.before[0])
            return fill(outcome, release_facts(manifest) if manifest else None, self.settings)
        facts = release_facts(manifest, since=self.started) if manifest else None
        step = facts.failed_step if facts else None
        kind_of = type(exc).__name__ if exc is not None else ""
        reason = error_reason(f"{kind_of}: {exc}") if exc is not None else error
        if step is not None:
            facts = release_facts(manifest, reached=ORDER[: ORDER.index(step) + 1], since=self.started)
            kind_of = error_type(facts.error) or kind_of
            reason = reason or error_reason(facts.error)
        elif exc is None or kind_of in INPUT_ERRORS:  # stopped before any step: the input or the servers
            step = RESOLVE
        kind, gate = classify(step, kind_of) if step else (FAILED, None)
        outcome = Outcome(self.model, kind, reason=reason or "see the command's output", step=step, gate=gate)
        outcome.checkpoint = str(self.checkpoint) if self.checkpoint else None  # as given (the workspace's wins)
        outcome.rollback = UNDONE if kind == FAILED and step in UNDO_ON_FAILURE else ""
        return fill(outcome, facts, self.settings)

    def rollback(self, exc: BaseException | None, code: int, error: str) -> Outcome | None:
        if exc is not None:
            if type(exc).__name__ in INPUT_ERRORS:  # the operator's typo, answered on their terminal
                return None
            reason = error_reason(f"{type(exc).__name__}: {exc}")
            failed = Outcome(self.model, FAILED, reason=f"rollback failed: {reason}", step="rollback")
            return fill(failed, None, self.settings)
        after = self.state()
        if code != 0 or after == self.before:
            return None
        numbers = mlflow_numbers(Path(str(self.settings.triton_repository)), self.model)
        (served, candidate), (now, _) = self.before, after
        outcome = Outcome(
            self.model,
            ROLLED_BACK,
            reason=self.reason,
            serving=now,
            serving_mlflow=numbers.get(now or 0),
            previous=served,
            previous_mlflow=numbers.get(served or 0),
            triton_version=candidate if now == served else None,  # only an in-flight candidate was withdrawn
        )
        return outcome


__all__ = ["COMMANDS", "Watch", "notify_outcome"]
