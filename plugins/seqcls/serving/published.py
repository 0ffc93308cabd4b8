"""A published Triton version read back as a graph the quality gate can score: the champion as served.

Each file is copied once into a scratch directory, hashed as it is copied and checked against the hash
its ``release.json`` recorded at publish: what is scored is what Triton loaded, or the gate refuses. When the
served version's files are damaged or gone, :func:`champion_graph` scores a verified copy instead (its pin,
release workspace or the MLflow model version's artifacts: :mod:`seqcls.serving.restore`), every hash checked.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqcls.contract import shipped
from seqcls.errors import ServingError
from seqcls.files import copy_hashed
from seqcls.gates.scoring import Graph
from seqcls.serving.backend import StoreRepository
from seqcls.serving.repository import RELEASE_FILE, Repository
from seqcls.serving.restore import plan

log = logging.getLogger(__name__)


def _verified_copy(vdir: Path, name: str, recorded: dict[str, str], scratch: Path, what: str) -> Path:
    """``vdir/name`` copied once into ``scratch`` and checked against the hash publish recorded."""
    digest = recorded.get(name)
    if digest is None:
        raise ServingError(f"{vdir / RELEASE_FILE} records no hash for {name}; {what} cannot be verified")
    target = scratch / vdir.parent.name / name
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(vdir / name, "rb") as src:
            got, _ = copy_hashed(src, target)
    except FileNotFoundError:
        raise ServingError(f"{vdir / name} is missing: {what} is damaged; run `seqcls sync`") from None
    if got != digest:
        raise ServingError(
            f"{vdir / name} changed since publish (sha256 {got[:12]} ≠ {digest[:12]}): {what} is damaged; "
            "run `seqcls status` / `seqcls sync`"
        )
    return target


def _info(vdir: Path, what: str) -> dict[str, Any]:
    path = vdir / RELEASE_FILE
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ServingError(f"{path} is missing: {what} cannot be scored; run `seqcls status`") from None
    except ValueError as exc:
        raise ServingError(f"{path} is not JSON ({exc}): {what} cannot be scored") from None


def served_graph(repo: Repository, version: int, scratch: Path) -> Graph:
    """Triton version ``version`` of ``repo``'s model as published: verified copies of its tokenizer and graph."""
    text_mod = shipped.text()
    names, what = repo.names, f"the served version {version} of {repo.model_name}"
    tok_dir, model_dir, post_dir = (
        repo.root / m / str(version) for m in (names.tokenizer, names.model, names.postprocess)
    )
    tok_info, model_info, post_info = _info(tok_dir, what), _info(model_dir, what), _info(post_dir, what)
    tok_file = str(tok_info.get("tokenizer_file") or "vocab.txt")
    tok_path = _verified_copy(tok_dir, tok_file, tok_info.get("files", {}), scratch, what)
    max_length = int(tok_info["max_length"])
    if tok_file == "tokenizer.json":
        tokenizer = text_mod.load_tokenizer(tok_path, max_length=max_length)
    else:
        table = text_mod.CHAR_CLASSES_FILE
        classes = None
        if table in tok_info.get("files", {}):
            classes = text_mod.read_char_classes(_verified_copy(tok_dir, table, tok_info["files"], scratch, what))
        tokenizer = text_mod.build_tokenizer(
            tok_path, lowercase=bool(tok_info.get("do_lower_case", True)), max_length=max_length, classes=classes
        )
    graph_files = sorted(n for n in model_info.get("files", {}) if n.startswith("model.onnx"))
    if "model.onnx" not in graph_files:
        raise ServingError(f"{model_dir / RELEASE_FILE} lists no model.onnx: {what} cannot be scored")
    copies = {n: _verified_copy(model_dir, n, model_info["files"], scratch, what) for n in graph_files}
    onnx = copies["model.onnx"]  # beside it: its external data file, when it has one
    labels = list(post_info["labels"])
    return Graph(
        "champion",
        onnx,
        tokenizer,
        int(tok_info.get("pad_id", 0)),
        labels,
        np.asarray(post_info["thresholds"], dtype=np.float32),
        bool(post_info.get("hierarchy", True)),
        str(post_info.get("profile") or "fp32"),
        version,
    )


def _assemble(repo: Repository, version: int, copy: Repository, extra: Sequence[Path]) -> list[str]:
    """A verified copy of ``version``'s composing models under ``copy.root``: each file from the live version
    when intact, else from the pin, the release workspace or ``extra`` (restore's sources), hashed as
    written. Returns what could not be found (empty: the copy is complete)."""
    p = plan(repo, version, extra=extra)
    missing = list(p.unknown)
    for model in repo.names.composing:
        recorded = repo.recorded(version, model)
        if recorded is None:
            continue  # named by plan's unknown
        live, target = repo.root / model / str(version), copy.root / model / str(version)
        target.mkdir(parents=True, exist_ok=True)
        (target / RELEASE_FILE).write_text(json.dumps(recorded), encoding="utf-8")  # what it was published as
        wanted = {w.target: w for ws in (*p.whole.values(), *p.files.values()) for w in ws}
        for rel, digest in (recorded.get("files") or {}).items():
            w = wanted.get(live / rel)
            source = live / rel if w is None else p.sources.get(digest)
            dst = target / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if w is not None and w.data is not None:
                dst.write_bytes(w.data)
                continue
            if source is None:
                missing.append(f"{model}/{version}/{rel}")
                continue
            with open(source, "rb") as fin:
                got, _ = copy_hashed(fin, dst)
            if got != digest:
                missing.append(f"{model}/{version}/{rel} (its copy {source} changed while read)")
    return missing


def champion_graph(repo: Repository, version: int, scratch: Path, extra: Sequence[Path] = ()) -> tuple[Graph, str]:
    """The served version ``version`` as published, and where it was read from: its live files when intact,
    else a verified copy (its pin and release workspace, or ``extra`` directories such as the MLflow model
    version's artifacts), every file checked against the hash publish recorded. ServingError naming what is
    missing when no verified copy is complete. On an ``s3://`` repository a version the working copy lacks is
    read from the store first, each file checked against the version's manifest."""
    if (store := StoreRepository.at(repo.root)) is not None and store.fetch_missing(repo.names.models, [version]):
        log.info("champion version %d read from %s (sha256 checked) for scoring", version, store)
    try:
        return served_graph(repo, version, scratch / "live"), "its published files"
    except ServingError as exc:
        live_error = exc
    copy = Repository(scratch / "copy", repo.source, repo.names)
    missing = _assemble(repo, version, copy, extra)
    if missing:
        raise ServingError(
            f"{live_error} — and no verified copy of it is complete (pin, release workspace"
            f"{', ' + ', '.join(str(e) for e in extra) if extra else ''}): missing {', '.join(missing[:5])}"
        )
    return served_graph(copy, version, scratch / "graph"), "a verified copy (its pin and release workspace or MLflow)"
