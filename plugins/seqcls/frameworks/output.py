"""The libraries' own chatter (Paddle, PaddleNLP, paddle2onnx, Polygraphy, MLflow) at debug level.

A release's log should read as its story: what was done, how much, how long. The libraries a step
drives print progress bars, banners and warnings of their own — Python ``warnings``, their loggers'
handlers, and C++ writes straight to file descriptors 1 and 2 — about thirty lines per release that
drown it. :func:`library_output` takes all of it for the duration of a step: descriptors 1 and 2 go to
a temporary file, warnings are caught, and seqcls's own log handlers keep writing to the real stderr.
Afterwards the captured text is logged line by line at DEBUG under ``seqcls.library`` (``-v`` shows
it) — and at WARNING when the step failed, since the library's last words may be the reason.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

log = logging.getLogger("seqcls.library")

#: The most captured lines re-logged after a failure (the end of the output: where the reason is).
FAILURE_TAIL = 40


def _console_handlers() -> list[logging.StreamHandler]:
    """seqcls's handlers (the root logger's and ``seqcls``'s) that write to descriptor 1 or 2."""
    found = []
    for logger in (logging.getLogger(), logging.getLogger("seqcls")):
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler:
                with contextlib.suppress(Exception):  # a stream without a descriptor (pytest's capture)
                    if handler.stream.fileno() in (1, 2):
                        found.append(handler)
    return found


@contextlib.contextmanager
def library_output(what: str) -> Iterator[None]:
    """Run the block with the libraries' output captured; log it at DEBUG (WARNING on failure) afterwards."""
    try:
        targets = [sys.__stdout__.fileno(), sys.__stderr__.fileno()]
    except (AttributeError, ValueError, io.UnsupportedOperation):  # no real descriptors: nothing to take
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = {fd: os.dup(fd) for fd in targets}
    console = os.fdopen(os.dup(saved[targets[-1]]), "w", buffering=1, encoding="utf-8", errors="replace")
    handlers = _console_handlers()
    streams = {h: h.setStream(console) for h in handlers}
    failed = False
    with tempfile.TemporaryFile() as sink:
        try:
            for fd in targets:
                os.dup2(sink.fileno(), fd)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")
                try:
                    yield
                except BaseException:
                    failed = True
                    raise
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd in targets:
                os.dup2(saved[fd], fd)
                os.close(saved[fd])
            for handler, stream in streams.items():
                handler.setStream(stream)
            console.close()
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            lines = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
            lines += [line.rstrip() for line in text.splitlines() if line.strip()]
            _say(what, lines, failed)


def _say(what: str, lines: list[str], failed: bool) -> None:
    if not lines:
        return
    if failed:
        tail = lines[-FAILURE_TAIL:]
        log.warning("%s: the libraries' last %d of %d output lines:\n%s", what, len(tail), len(lines), "\n".join(tail))
        return
    log.debug("%s: %d lines of library output:\n%s", what, len(lines), "\n".join(lines))


__all__ = ["library_output"]
