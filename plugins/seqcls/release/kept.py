"""The eval set a release is judged on, found and kept: read once at resolve, scored from that copy.

Resolve (:mod:`seqcls.steps.preflight`) reads the file once — refused in seconds when it is larger, has more
texts, or fewer, than a verdict may be taken on (:class:`~seqcls.gates.evalset.Limits`) — checks it against
the checkpoint's labels and keeps its bytes once per release home, by content
(``<home>/evalsets/<sha256><suffix>``: one copy however many releases are judged on it). The workspace
records which copy it was judged on; the quality gate (:mod:`seqcls.steps.evaluate`) scores that very copy,
wherever its task runs, without looking for the original again — a file changed or deleted after resolve has
no effect.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from seqcls.checkpoints.checkpoint import inside_checkpoint, sha256_file
from seqcls.errors import InputError
from seqcls.files import atomic_write
from seqcls.gates.evalset import EvalSet, Limits, parse_eval_set, read_once
from seqcls.release.workspace import Release

log = logging.getLogger(__name__)

#: The checkpoint's own labeled files, in the order they are taken when no eval set is configured
#: (test before dev: dev chose the training's best epoch, so it flatters the model).
OWN_EVAL_FILES = ("test.jsonl", "test.txt", "test.tsv", "dev.jsonl", "dev.txt", "dev.tsv")
#: The manifest's record of the eval sets resolve kept: the file as found → its copy, sha256, source, and
#: the ``eval_set`` param it was found for (None: the checkpoint's own).
KEPT = "eval_sets"


def limits(release: Release) -> Limits:
    """The deployment's ceilings (``SEQCLS_EVAL_SET_MAX_*``) and the release's floor (``min_eval_texts``)."""
    settings = release.settings
    return Limits(
        max_bytes=int(settings.eval_set_max_mb * 1_000_000),
        max_texts=settings.eval_set_max_texts,
        min_texts=release.config.min_eval_texts,
    )


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


def _copy_of(release: Release, sha256: str, suffix: str) -> Path:
    return release.settings.eval_sets_dir / f"{sha256}{suffix}"


def preflight_eval_set(release: Release) -> EvalSet | None:
    """The eval set read once, checked against its limits and the checkpoint's labels and kept — at resolve,
    so a typo or a set too large or too small fails in seconds, before any export; evaluate then scores those
    very bytes (:func:`kept_eval_set`), never the file again, wherever its task runs."""
    found = locate_eval_set(release)
    if found is None:
        return None
    bounds = limits(release)
    data = read_once(found[0], bounds.max_bytes)
    es = parse_eval_set(data, found[0], list(release.checkpoint.labels), source=found[1], limits=bounds)
    copy = _copy_of(release, es.sha256, found[0].suffix)
    if not (copy.is_file() and sha256_file(copy) == es.sha256):  # written once per home, by content
        copy.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(copy, data)
    ws = release.workspace
    with ws.lock():
        manifest = ws.read()
        manifest.setdefault(KEPT, {})[str(found[0])] = {
            "copy": str(copy),
            "sha256": es.sha256,
            "source": found[1],
            "configured": release.config.eval_set,
        }
        ws.write(manifest)
    log.info("eval set %s: %d labeled texts (%s), sha256 %s", es.path, len(es.texts), es.source, es.sha256[:12])
    return es


def _kept_entry(release: Release) -> tuple[str, dict[str, Any]] | None:
    """The newest copy kept for this release's ``eval_set`` param, found without looking at the original."""
    kept = release.workspace.read().get(KEPT) or {}
    matching = [(path, e) for path, e in kept.items() if e.get("configured") == release.config.eval_set]
    return matching[-1] if matching else None


def kept_eval_set(release: Release) -> EvalSet | None:
    """What :func:`preflight_eval_set` kept for this eval set (verified), else the file read now."""
    found = _kept_entry(release)
    if found is not None:
        path, entry = found
        copy = Path(entry["copy"])
        copy = copy if copy.is_absolute() else release.workspace.path(entry["copy"])  # kept in the workspace
        try:
            data = read_once(copy, limits(release).max_bytes)
        except InputError as exc:
            log.warning("evaluate: the kept copy of %s is not readable (%s); reading the eval set again", path, exc)
        else:
            if hashlib.sha256(data).hexdigest() == entry["sha256"]:
                labels = list(release.checkpoint.labels)
                return parse_eval_set(data, Path(path), labels, source=entry["source"], limits=limits(release))
            log.warning("evaluate: the kept copy %s of %s changed; reading the eval set again", copy, path)
    return preflight_eval_set(release)


__all__ = ["KEPT", "OWN_EVAL_FILES", "kept_eval_set", "limits", "locate_eval_set", "preflight_eval_set"]
