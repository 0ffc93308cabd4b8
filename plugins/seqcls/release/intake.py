"""The intake of a release: a checkpoint directory checked in a fixed order, fingerprinted, taken into
its workspace's snapshot — and a later task's release reopened from that snapshot.

The common checks (the directory, links out of it, ``config.json``, labels, golden texts) are
here; what differs by framework — weights it may read, its tokenizer, the files that define the
model — is asked of the adapter :func:`seqcls.frameworks.detect` picks from ``config.json``. The
readers both use are :mod:`seqcls.checkpoints.checkpoint`. Cheap: no paddle or torch import.

A release does not validate the operator's directory in place: :func:`take_checkpoint` copies the
files it reads into a snapshot (:mod:`seqcls.checkpoints.snapshot`), hashing the bytes it copies,
and validates and fingerprints the copy — so the bytes checked, fingerprinted and later served
are one and the same; its messages still name the operator's files. :func:`open_release` is the
``resolve`` step; :func:`reopen_release` is what every later task of a run opens.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from seqcls.checkpoints import snapshot, torchload
from seqcls.checkpoints.checkpoint import (
    GOLDEN_FILE,
    LABEL_FILE,
    OTHER_WEIGHT_FILES,
    WEIGHT_FILES,
    Checkpoint,
    inside_checkpoint,
    is_torch_pickle,
    num_labels_of,
    read_golden,
    read_labels,
    read_model_config,
    sha256_file,
    weight_files,
    weights_path,
)
from seqcls.checkpoints.snapshot import SNAPSHOT_DIR
from seqcls.config import ReleaseConfig, serving_spec
from seqcls.errors import CheckpointError
from seqcls.files import atomic_write, out_of_space, resource_error
from seqcls.frameworks import FRAMEWORKS, Framework, detect
from seqcls.release.workspace import SCHEMA, Release, Workspace, workspace_dir
from seqcls.settings import Settings

log = logging.getLogger(__name__)

INTAKE_DIR = ".intake"  # <releases>/<model>/.intake/<pid>-<random>/: a snapshot being taken in

#: Every model file any framework reads (a checkpoint's links are checked before its framework is known).
READ_FILES = tuple(dict.fromkeys(name for framework in FRAMEWORKS for name in framework.model_files))
#: What a snapshot takes from a checkpoint when present: every file a check reads or looks for by name,
#: so the checks give the copy the verdict they would give the directory.
TAKEN_FILES = tuple(
    dict.fromkeys((*READ_FILES, *WEIGHT_FILES, *OTHER_WEIGHT_FILES, torchload.TORCH_INDEX, GOLDEN_FILE))
)


def _checkpoint_root(path: str | Path) -> Path:
    root = Path(path).expanduser()
    if not root.exists():
        raise CheckpointError(f"{root}: checkpoint directory does not exist.")
    if not root.is_dir():
        raise CheckpointError(f"{root}: is not a directory; pass the directory save_pretrained wrote.")
    return root.resolve()


def _refuse_outside_links(root: Path, *, skip: frozenset[str] = frozenset()) -> None:
    """Every file seqcls reads from the checkpoint must be in it (a symlink to ``../x`` outside is refused)."""
    for name in (*READ_FILES, *WEIGHT_FILES, torchload.TORCH_WEIGHTS, torchload.TORCH_INDEX, GOLDEN_FILE):
        if name not in skip:
            inside_checkpoint(root, name)


def _read_model_config(root: Path) -> tuple[dict, Path, int]:
    """The model config (``config.json`` or PaddleNLP 2.x's ``model_config.json``, flat), its file and its
    label count; refuses a model that is not a sequence classifier."""
    config, path = read_model_config(root)
    num_labels = num_labels_of(config, path)
    arch = config.get("architectures") or []
    if arch and not any("SequenceClassification" in a for a in arch):
        raise CheckpointError(
            f"{path}: architectures {arch} is not a sequence classifier (expected e.g. ErnieForSequenceClassification)."
        )
    return config, path, num_labels


def _read_model_labels(label_path: Path, num_labels: int, config_name: str) -> tuple[str, ...]:
    labels = read_labels(label_path)
    if len(labels) != num_labels:
        raise CheckpointError(
            f"{label_path}: {len(labels)} labels but {config_name} says the model has {num_labels} "
            "(num_labels); the label file must list exactly one line per output."
        )
    return labels


def _hash_model_files(
    root: Path,
    label_path: Path,
    weights: Path,
    framework: Framework,
    known: dict[str, str] | None = None,
    converted: dict | None = None,
) -> tuple[dict[str, str], str]:
    """sha256 of every model-defining file present (``known``: hashes taken as the files were copied), and
    the fingerprint over them. Weights converted at intake (``converted``) are fingerprinted as the files
    they came as — the model as trained — so the operator's directory and its snapshot hash alike."""
    known = known or {}
    files: dict[str, str] = {}
    for name in framework.model_files:
        p = label_path if name == LABEL_FILE else root / name
        if p.exists():
            files[name] = known.get(name) or sha256_file(p)
    for path in weight_files(weights):
        files[path.name] = known.get(path.name) or sha256_file(path)
    identity = dict(files)
    if converted:
        identity.pop(weights.name)
        identity.update(converted["from"])
    fingerprint = hashlib.sha256("\n".join(f"{k}={v}" for k, v in sorted(identity.items())).encode()).hexdigest()
    return files, fingerprint


def resolve_checkpoint(
    path: str | Path,
    *,
    label_file: str | Path | None = None,
    golden_file: str | Path | None = None,
    allow_unsafe_pickle: bool = False,
    known: dict[str, str] | None = None,
    source: Path | None = None,
    converted: dict | None = None,
) -> Checkpoint:
    """Validate a checkpoint directory and fingerprint it (sha256 over the model-defining files).

    For a snapshot (:func:`take_checkpoint`): ``known`` are its files' hashes, taken as they were copied
    or verified (not read again), ``source`` the directory it was taken from (recorded, and logged),
    ``converted`` how its weights were made from the files it was taken as (the snapshot record's)."""
    root = _checkpoint_root(path)
    given = ((LABEL_FILE, label_file), (GOLDEN_FILE, golden_file))  # files given explicitly may live anywhere
    _refuse_outside_links(root, skip=frozenset(name for name, file in given if file))
    config, config_path, num_labels = _read_model_config(root)
    framework = detect(config, config_path)
    intake = framework.check_checkpoint(root, config, allow_unsafe_pickle=allow_unsafe_pickle)
    weights, vocab_size = intake.weights, intake.vocab_size
    label_path = Path(label_file).expanduser().resolve() if label_file else root / LABEL_FILE
    labels = _read_model_labels(label_path, num_labels, config_path.name)
    golden_path = Path(golden_file).expanduser().resolve() if golden_file else root / GOLDEN_FILE
    golden = read_golden(golden_path) if (golden_file or golden_path.exists()) else None
    files, fingerprint = _hash_model_files(root, label_path, weights, framework, known, converted)
    golden_sha256 = ((known or {}).get(GOLDEN_FILE) or sha256_file(golden_path)) if golden else None

    ckpt = Checkpoint(
        path=root,
        weights=weights,
        labels=labels,
        num_labels=num_labels,
        vocab_size=vocab_size,
        do_lower_case=intake.do_lower_case,
        max_position_embeddings=int(config.get("max_position_embeddings", 512)),
        fingerprint=fingerprint,
        files=files,
        golden_texts=golden,
        golden_sha256=golden_sha256,
        framework=framework.name,
        architecture=str((config.get("architectures") or [""])[0]),
        source=source,
        converted=converted,
    )
    log.info(
        "checkpoint %s (%s %s): %d labels, vocab %d, weights %s (%.1f MB), fingerprint %s",
        ckpt.origin,
        framework.name,
        ckpt.architecture or "?",
        num_labels,
        vocab_size,
        weights.name,
        weights.stat().st_size / 1e6,
        ckpt.short_fingerprint,
    )
    return ckpt


def directory_fingerprint(path: str | Path) -> str:
    """The fingerprint :func:`resolve_checkpoint` gives ``path`` (with its own ``label.txt``), hashing only."""
    root = _checkpoint_root(path)
    _refuse_outside_links(root)
    config, config_path = read_model_config(root)
    framework = detect(config, config_path)
    return _hash_model_files(root, root / LABEL_FILE, weights_path(root), framework)[1]


def _origins(root: Path, label_file: str | Path | None, golden_file: str | Path | None) -> dict[str, Path]:
    """Name in the snapshot -> the file it is read from: the checkpoint's own (a link followed only when it
    stays inside), and the label/golden files given explicitly, wherever they are."""
    given = {
        name: Path(file).expanduser().resolve()
        for name, file in ((LABEL_FILE, label_file), (GOLDEN_FILE, golden_file))
        if file
    }
    weights = weights_path(root)  # by name only: two weights files or a stray shard index refused before any copy
    names = list(TAKEN_FILES)
    if weights.name == torchload.TORCH_INDEX:  # the shards the index lists (plain names; checked again on the copy)
        names += torchload.shard_files(inside_checkpoint(root, weights.name))
    origins = {}
    for name in names:
        if name in given or not inside_checkpoint(root, name).is_file():
            continue
        target = (root / name).resolve()
        if not target.is_relative_to(root):  # relinked since the check: refused the same way
            inside_checkpoint(root, name)
            raise CheckpointError(f"{root / name}: changed while the checkpoint was read; retry when it is complete.")
        origins[name] = target
    return {**origins, **given}


def _at_source(exc: CheckpointError, staging: Path, root: Path, origins: dict[str, Path]) -> CheckpointError:
    """``exc`` from checking the snapshot ``staging``, naming the operator's files instead of the copies."""
    message = str(exc)
    for name in (LABEL_FILE, GOLDEN_FILE):
        if name in origins and origins[name] != root / name:
            message = message.replace(str(staging / name), str(origins[name]))
    return CheckpointError(message.replace(str(staging), str(root)))


def take_checkpoint(
    path: str | Path,
    staging: Path,
    *,
    label_file: str | Path | None = None,
    golden_file: str | Path | None = None,
    allow_unsafe_pickle: bool = False,
) -> tuple[Checkpoint, snapshot.Taken]:
    """Copy the checkpoint's files into the new directory ``staging`` (hashing the bytes copied), then
    validate and fingerprint the copy: the Checkpoint points at ``staging``, ``source`` at ``path``."""
    root = _checkpoint_root(path)
    origins = _origins(root, label_file, golden_file)
    if LABEL_FILE not in origins:
        origins[LABEL_FILE] = root / LABEL_FILE  # missing: the check below says so, naming it
    if golden_file and not origins[GOLDEN_FILE].is_file():
        read_golden(origins[GOLDEN_FILE])  # a golden file asked for must be there: its error names it
    taken = snapshot.take({n: p for n, p in origins.items() if p.is_file()}, staging, root)
    copy = staging.resolve()
    try:  # the fingerprint is over the hashes of the bytes copied: what the snapshot holds, by construction
        ckpt = resolve_checkpoint(copy, allow_unsafe_pickle=allow_unsafe_pickle, known=taken.files, source=root)
        if is_torch_pickle(ckpt.weights):
            ckpt, taken = _convert_torch(ckpt, taken, copy)
    except CheckpointError as exc:
        raise _at_source(exc, copy, root, origins) from exc
    read = set(ckpt.files) | ({GOLDEN_FILE} if ckpt.golden_texts else set())
    return ckpt, snapshot.keep_only(taken, staging, read)


def _convert_torch(ckpt: Checkpoint, taken: snapshot.Taken, copy: Path) -> tuple[Checkpoint, snapshot.Taken]:
    """The snapshot ``copy`` with its PyTorch pickles replaced by ``model.safetensors`` (restricted load):
    every later step, the registry and the published version read safetensors only."""
    sources = [name for name in ckpt.files if torchload.is_weight_file(name)]  # as fingerprinted: no re-read
    index = ckpt.weights.name if ckpt.weights.name == torchload.TORCH_INDEX else None
    conversion = torchload.convert(
        {n: ckpt.files[n] for n in sources}, copy, copy / torchload.SAFETENSORS, index=index
    ).to_dict()
    taken = snapshot.converted(taken, copy, sources, torchload.SAFETENSORS, conversion)
    files = {
        **{n: d for n, d in ckpt.files.items() if n not in sources},
        torchload.SAFETENSORS: taken.files[torchload.SAFETENSORS],
    }
    return replace(ckpt, weights=copy / torchload.SAFETENSORS, files=files, converted=conversion), taken


def check_snapshot(snap: Path, taken: snapshot.Taken, *, allow_unsafe_pickle: bool = False) -> Checkpoint:
    """The Checkpoint of the snapshot ``snap`` just verified against ``taken`` (its checks run again on the
    copy, its hashes are the verified ones; messages name the source)."""
    root = Path(taken.source)
    origins = {name: Path(p) for name, p in taken.origins.items()}
    try:
        return resolve_checkpoint(
            snap,
            allow_unsafe_pickle=allow_unsafe_pickle,
            known=taken.files,
            source=root,
            converted=taken.converted.get(torchload.SAFETENSORS),
        )
    except CheckpointError as exc:
        raise _at_source(exc, snap.resolve(), root, origins) from exc


@contextlib.contextmanager
def _intake(model_dir: Path) -> Iterator[Path]:
    """A fresh directory to take a snapshot into before its fingerprint (so its workspace) is known."""
    staging = model_dir / INTAKE_DIR / f"{os.getpid()}-{secrets.token_hex(4)}"
    try:
        yield staging / SNAPSHOT_DIR
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _relocated(ckpt: Checkpoint, snap: Path) -> Checkpoint:
    return replace(ckpt, path=snap, weights=snap / ckpt.weights.name)


def _settle(ws: Workspace, ckpt: Checkpoint, taken: snapshot.Taken, staging: Path) -> Checkpoint:
    """Under the workspace lock: keep its snapshot when intact and of these very files, else install ``staging``."""
    final = ws.path(SNAPSHOT_DIR)
    if final.exists():
        try:
            existing = snapshot.verify(final)
            if existing.files == taken.files:
                if existing != taken:  # the same bytes taken from another directory: the record names this one
                    atomic_write(final / snapshot.RECORD, taken.to_json())
                log.info("checkpoint snapshot %s: intact and of these files — kept", final)
                return _relocated(ckpt, final)
        except snapshot.DamagedSnapshot as exc:
            log.warning("checkpoint snapshot replaced — %s", exc)
    snapshot.install(staging, final)
    log.info("checkpoint snapshot %s: %d files, %.1f MB (one per workspace)", final, len(taken.files), taken.megabytes)
    return _relocated(ckpt, final)


def open_release(
    checkpoint: str | Path,
    config: ReleaseConfig | None = None,
    settings: Settings | None = None,
    *,
    label_file: str | Path | None = None,
    golden_file: str | Path | None = None,
) -> Release:
    """Take the checkpoint into its workspace's snapshot, validated, and open (or create) the workspace;
    the ``resolve`` step. The release reads the snapshot only (``checkpoint.path``; ``.origin``: ``checkpoint``).
    Its serving spec is resolved here, from the config and this environment's defaults, and recorded."""
    config = config or ReleaseConfig()
    settings = settings or Settings.from_env()
    spec = serving_spec(config, settings)  # settings that cannot go together: refused before any copy
    model_dir = settings.releases_dir / config.model_name
    try:
        with _intake(model_dir) as staging:
            ckpt, taken = take_checkpoint(
                checkpoint,
                staging,
                label_file=label_file,
                golden_file=golden_file,
                allow_unsafe_pickle=config.allow_unsafe_pickle,
            )
            ws = Workspace(workspace_dir(settings, config.model_name, ckpt.fingerprint))
            with ws.lock():
                ckpt = _settle(ws, ckpt, taken, staging)
        ws.annotate(
            schema=SCHEMA,
            model_name=config.model_name,
            fingerprint=ckpt.fingerprint,
            checkpoint=ckpt.to_dict(),
            config=config.to_dict(),
            serving=spec.to_dict(),
        )
    except OSError as exc:
        if out_of_space(exc):
            raise resource_error(model_dir, exc, "taking the checkpoint into its release workspace") from exc
        raise
    log.info("release workspace %s (model %s, fingerprint %s)", ws.root, config.model_name, ckpt.short_fingerprint)
    return Release(settings, config, ckpt, ws, spec)


def _source_args(taken: snapshot.Taken) -> dict[str, Any]:
    """How the snapshot's source was taken in: its directory, and label/golden files given from elsewhere."""
    root = Path(taken.source)
    args: dict[str, Any] = {"path": root}
    for name, key in ((LABEL_FILE, "label_file"), (GOLDEN_FILE, "golden_file")):
        origin = taken.origins.get(name)
        if origin and not Path(origin).is_relative_to(root):
            args[key] = Path(origin)
    return args


def _remake(
    ws: Workspace, config: ReleaseConfig, fingerprint: str, damage: CheckpointError, source: Callable[[], Path] | None
) -> Checkpoint:
    """Re-take a damaged (or missing) snapshot from its source — only if that still hashes to ``fingerprint``."""
    snap = ws.path(SNAPSHOT_DIR)
    try:
        args = _source_args(snapshot.read_record(snap))
    except snapshot.DamagedSnapshot:
        if source is None:
            raise damage from None
        args = {"path": source()}
    root = args.pop("path")
    with _intake(ws.root.parent) as staging:
        try:
            ckpt, _ = take_checkpoint(root, staging, allow_unsafe_pickle=config.allow_unsafe_pickle, **args)
        except CheckpointError as exc:
            raise CheckpointError(f"{damage} Re-making the snapshot from {root} failed: {exc}") from exc
        if ckpt.fingerprint != fingerprint:
            raise CheckpointError(
                f"{damage} It cannot be re-made: {root} no longer hashes to this run's fingerprint {fingerprint[:16]} "
                f"(now {ckpt.short_fingerprint}: the checkpoint changed since the run resolved it). Trigger a new run."
            )
        snapshot.install(staging, snap)
    log.warning("checkpoint snapshot %s re-made from %s — %s", snap, root, damage)
    return _relocated(ckpt, snap)


def reopen_release(
    settings: Settings,
    config: ReleaseConfig,
    fingerprint: str,
    *,
    source: Callable[[], Path] | None = None,
) -> Release:
    """The release of ``fingerprint`` from its workspace's snapshot, verified — what a later task of a run
    opens, so a checkpoint changed in place since resolve has no effect on the run. A damaged snapshot is
    re-made from its recorded source (else ``source()``) only while that still hashes to ``fingerprint``."""
    ws = Workspace(workspace_dir(settings, config.model_name, fingerprint))
    snap = ws.path(SNAPSHOT_DIR)
    with ws.lock():
        try:
            taken = snapshot.verify(snap)
        except snapshot.DamagedSnapshot as damage:
            ckpt = _remake(ws, config, fingerprint, damage, source)
        else:
            ckpt = _relocated(check_snapshot(snap, taken, allow_unsafe_pickle=config.allow_unsafe_pickle), snap)
    if ckpt.fingerprint != fingerprint:
        raise CheckpointError(
            f"{snap}: its files hash to {ckpt.short_fingerprint}, not to this run's fingerprint {fingerprint[:16]}; "
            "trigger a new run."
        )
    # what resolve recorded: this worker's environment does not change what the run publishes
    spec = serving_spec(config, settings, recorded=ws.read().get("serving"))
    return Release(settings, config, ckpt, ws, spec)
