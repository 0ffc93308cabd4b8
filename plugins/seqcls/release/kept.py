"""The eval set a release is judged on, found and kept: read once at resolve, scored from that copy.

Resolve (:mod:`seqcls.steps.preflight`) reads the file once, checks it against the checkpoint's labels
and keeps its bytes in the workspace; the quality gate (:mod:`seqcls.steps.evaluate`) scores that very
copy, never the file again, wherever its task runs — a file changed after the check has no effect.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from seqcls.checkpoints.checkpoint import inside_checkpoint, sha256_file
from seqcls.errors import InputError
from seqcls.files import atomic_write
from seqcls.gates.evalset import EvalSet, parse_eval_set, read_once
from seqcls.release.records import EVAL_SET_DIR
from seqcls.release.workspace import Release

log = logging.getLogger(__name__)

#: The checkpoint's own labeled files, in the order they are taken when no eval set is configured
#: (test before dev: dev chose the training's best epoch, so it flatters the model).
OWN_EVAL_FILES = ("test.jsonl", "test.txt", "test.tsv", "dev.jsonl", "dev.txt", "dev.tsv")
#: The manifest's record of the eval sets resolve kept: the file as configured → its copy, sha256, source.
KEPT = "eval_sets"


def locate_eval_set(release: Release) -> tuple[Path, str] | None:
    """The eval set's file and where it came from: configured, else the checkpoint's own, else None."""
    configured = release.config.eval_set
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file():
            raise InputError(
                f"eval_set {configured!r}: no such file. Give a labeled file (PaddleNLP's text<TAB>label,label "
                'or JSONL {"text", "labels"}) with --eval-set / the eval_set param.'
            )
        return path, "configured"
    origin = Path(release.checkpoint.origin)
    for name in OWN_EVAL_FILES:
        path = inside_checkpoint(origin, name)
        if path.is_file():  # resolved: a link inside the checkpoint is allowed, the reader refuses links
            return path.resolve(), f"the checkpoint's own {name} (no eval set configured)"
    return None


def preflight_eval_set(release: Release) -> EvalSet | None:
    """The eval set read once, checked against the checkpoint's labels and kept in the workspace — at
    resolve, so a typo fails in seconds, before any export; evaluate then scores those very bytes
    (:func:`kept_eval_set`), never the file again, wherever its task runs."""
    found = locate_eval_set(release)
    if found is None:
        return None
    data = read_once(found[0])
    es = parse_eval_set(data, found[0], list(release.checkpoint.labels), source=found[1])
    ws = release.workspace
    rel = f"{EVAL_SET_DIR}/{es.sha256[:16]}{found[0].suffix}"
    with ws.lock():
        if not (ws.path(rel).is_file() and sha256_file(ws.path(rel)) == es.sha256):
            ws.path(EVAL_SET_DIR).mkdir(exist_ok=True)
            atomic_write(ws.path(rel), data)
        manifest = ws.read()
        manifest.setdefault(KEPT, {})[str(found[0])] = {"copy": rel, "sha256": es.sha256, "source": found[1]}
        ws.write(manifest)
    log.info("eval set %s: %d labeled texts (%s), sha256 %s", es.path, len(es.texts), es.source, es.sha256[:12])
    return es


def kept_eval_set(release: Release) -> EvalSet | None:
    """What :func:`preflight_eval_set` kept for this eval set (verified), else the file read now."""
    found = locate_eval_set(release)
    if found is None:
        return None
    ws = release.workspace
    entry = (ws.read().get(KEPT) or {}).get(str(found[0]))
    if entry and ws.path(entry["copy"]).is_file():
        data = ws.path(entry["copy"]).read_bytes()
        if hashlib.sha256(data).hexdigest() == entry["sha256"]:
            return parse_eval_set(data, found[0], list(release.checkpoint.labels), source=found[1])
        log.warning("evaluate: the kept copy %s of %s changed; reading the eval set again", entry["copy"], found[0])
    return preflight_eval_set(release)


__all__ = ["KEPT", "OWN_EVAL_FILES", "kept_eval_set", "locate_eval_set", "preflight_eval_set"]
