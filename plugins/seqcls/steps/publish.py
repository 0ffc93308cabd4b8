"""Step 5 — publish: the validated model as a new immutable version N of all four Triton models.

Version N is assembled in a temporary directory inside the repository root (same filesystem)
and each ``<model>/N`` is renamed into place, so a server never sees a half-written version;
nothing live changes here (the ``config.pbtxt`` files that say what is served are switched by
``reload``). Publishing the same release again reuses its version if every file is intact.

A version number is never reused: N = max(the state's ``published`` counter, every version on
disk) + 1, recorded in the serving state *before* a directory is written — a deleted directory
cannot hand its number (and Triton's in-memory copy of it) to other weights. Every file taken from
the release (the checkpoint's tokenizer files, the workspace's ONNX) is hashed as it is copied and
must equal the hash recorded when it was fingerprinted or written: publish ships exactly those
bytes or nothing. Retention follows the recorded state: versions beyond ``retain`` are pruned, never
the served, previous or candidate one, one the next ``retain - 1`` rollbacks would serve, or one a
live config names. A served version that is missing or damaged is restored here from verified copies (its pin
and release workspace); when none is left the release proceeds beside what Triton holds, saying so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqcls import faults
from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.contract import shipped
from seqcls.contract.names import MODEL, POSTPROCESS, TOKENIZER, ServingNames
from seqcls.errors import ServingError
from seqcls.files import copy_hashed, replace_dir
from seqcls.release import control, verdicts
from seqcls.release.keys import release_values
from seqcls.release.records import OUT_DIRS, Published, served_onnx, serving_tokenizer
from seqcls.release.workspace import Release, StepResult
from seqcls.serving import restore
from seqcls.serving.backend import StoreRepository
from seqcls.serving.pins import drop_pin, read_pin, write_pin
from seqcls.serving.repository import (
    DEFAULT_RETAIN,
    DIRECT_SOURCE,
    DIRECT_STEPS,
    DIRECT_STEPS_FILE,
    RELEASE_FILE,
    SNAPSHOT,
    Repository,
    ServingOptions,
    check_configs,
    direct_steps,
    render_config,
    source_dir,
)
from seqcls.serving.state import ServingState, append_event, current_state, write_state
from seqcls.steps import require

log = logging.getLogger(__name__)

STEP = "publish"
OUT_DIR = OUT_DIRS[STEP]
#: Where a version is assembled before its renames (``seqcls sync`` removes one whose pid is gone).
TMP_PUBLISH = ".tmp-publish.{model}.{pid}-{version}"
#: An empty *file* of this name in every python model version: the stub's Python cannot write bytecode
#: there (it skips, silently, on any Python), so a version never changes after publish — Triton reloads a
#: model whose files changed since its last load at the next load that polls it (an ensemble's polls its
#: composing models), which cost every reload a second start of each composing stub.
NO_BYTECODE = "__pycache__"


#: Serving source file of each python model (``tokenizer_impl`` picks the tokenizer's flavour), by
#: source directory (the classic names; :meth:`ServingNames.source` maps any model's names to them).
MODEL_SOURCES = {
    (TOKENIZER, "hf"): f"{TOKENIZER}/model.py",
    (TOKENIZER, "paddlenlp"): f"{TOKENIZER}/model_paddlenlp.py",
    (MODEL, "python-onnxruntime"): f"{MODEL}/model.py",
    (POSTPROCESS, None): f"{POSTPROCESS}/model.py",
}

#: The serving tokenizers (``ServingTokenizer.kind``) each ``tokenizer_impl`` can serve: the classic
#: PaddleNLP tokenizer only a WordPiece vocabulary, ``hf`` (seqcls_text) that and a ``tokenizer.json``.
IMPL_SERVES = {"hf": ("wordpiece", "tokenizer.json"), "paddlenlp": ("wordpiece",)}
#: Checkpoint files each ``tokenizer_impl`` also reads when the checkpoint has them.
IMPL_READS = {"hf": (), "paddlenlp": ("tokenizer_config.json",)}


def _files_for(release: Release, triton_name: str, options: ServingOptions, names: ServingNames) -> dict[str, Path]:
    """Source files of one model version (target name -> source path)."""
    src = Path(release.settings.model_repository_source or "")
    if options.pipeline == "direct" and names.role(triton_name) == "ensemble":
        return {"model.py": src / DIRECT_SOURCE / "model.py"}  # + the steps' files, linked in by _write_version
    model = names.source(triton_name)
    key = {TOKENIZER: options.tokenizer_impl, MODEL: options.runtime}.get(model)
    files: dict[str, Path] = {}
    if (model, key) in MODEL_SOURCES:  # a python model: its model.py and the modules it imports
        files["model.py"] = src / MODEL_SOURCES[(model, key)]
        files.update(shipped.files_for(model, release.settings))
    if model == TOKENIZER:
        tokenizer = serving_tokenizer(release)
        if tokenizer.kind not in IMPL_SERVES[options.tokenizer_impl]:
            raise ServingError(
                "tokenizer_impl 'paddlenlp' serves PaddleNLP's tokenizer; this is a transformers checkpoint — "
                "serve it with tokenizer_impl 'hf' (its own tokenizer.json)"
            )
        files[tokenizer.file.name] = tokenizer.file
        for name in IMPL_READS[options.tokenizer_impl]:
            if (release.checkpoint.path / name).is_file():
                files[name] = release.checkpoint.path / name
    elif model == MODEL:
        files["model.onnx"] = served_onnx(release.workspace)
    return files


def publish_key(
    values: dict[str, Any],
    files: dict[str, dict[str, Path]],
    options: ServingOptions,
    template_root: Path,
    names: ServingNames,
) -> str:
    """Content address of a release's serving form: same key → same bytes in every version dir."""
    opts = options.to_dict()
    if opts["pipeline"] == "ensemble":  # the default is left out: versions published before pipelines keep their key
        del opts["pipeline"]
    h = hashlib.sha256(json.dumps({"values": values, "options": opts}, sort_keys=True).encode())
    for model in names.models:
        for name, path in sorted(files.get(model, {}).items()):
            h.update(f"{model}/{name}={sha256_file(path)}".encode())
        for tmpl in sorted((template_root / source_dir(model, options, names)).glob("*.tmpl")):
            h.update(f"{model}/{tmpl.name}={sha256_file(tmpl)}".encode())
    return h.hexdigest()


def find_published(repo: Repository, key: str) -> int | None:
    """The newest intact version holding this release (same publish key) that went live with its verdicts: a
    version published without them (a path that skipped the gates) is never reused — releasing through the
    gates writes a new one, which is how `seqcls status` says to fix it."""
    store = StoreRepository.at(repo.root)
    for v in reversed(repo.complete_versions()):
        info = repo.recorded(v, repo.names.ensemble)
        usable = info and info.get("publish_key") == key and not repo.damaged_files(v) and not verdicts.unverified(info)
        if usable and (store is None or store.complete(repo.names.models, v)):  # on a store: only one whole there
            return v
    return None


def upload(repo: Repository, version: int) -> None:
    """On an ``s3://`` repository, version ``version`` (renamed into the working copy) uploaded whole to the
    store, the ensemble last. A failure removes the local copy (it is not reused) and names the store:
    the store keeps an incomplete version (no manifest: never served, never allocated again)."""
    if (store := StoreRepository.at(repo.root)) is None:
        return
    try:
        published = store.publish(repo.names.models, version)
    except Exception as exc:
        for model in repo.names.models:
            shutil.rmtree(repo.root / model / str(version), ignore_errors=True)
        raise ServingError(
            f"publishing version {version} of {repo.model_name!r} to the object store {store} failed: {exc}. "
            "Nothing served changed (a version without its manifest is never served); release again once the "
            "store answers — it publishes a new version number."
        ) from exc
    log.info("publish: version %d on %s: %d objects, %.1f MB in %.2f s", version, store,
             sum(p.objects for p in published), sum(p.bytes for p in published) / 1e6,
             sum(p.seconds for p in published))  # fmt: skip


def prune(repo: Repository, retain: int, state: ServingState) -> list[int]:
    """Delete complete versions older than the newest ``retain``, except what the recorded ``state``
    needs — serving, previous, candidate and what the next ``retain - 1`` rollbacks reach (the whole
    chain would be every release ever made; a rollback beyond it is refused by the transition check) —
    and any a live config names."""
    models = repo.names.models
    live = {v for m in models for v in repo.live_versions(m)}
    recorded = state.protected_versions(depth=retain - 1)
    all_versions = sorted({v for m in models for v in repo.versions(m)})
    keep = set(all_versions[-retain:]) | live | recorded
    removed = []
    for v in all_versions:
        if v in keep:
            continue
        for m in models:
            shutil.rmtree(repo.root / m / str(v), ignore_errors=True)
        drop_pin(repo.root, repo.model_name, v)
        removed.append(v)
    if removed:
        log.info("publish: pruned old versions %s (retain %d, kept %s)", removed, retain, sorted(live | recorded))
    return removed


def recorded_digests(release: Release) -> dict[str, str]:
    """Absolute path → the sha256 recorded when the file was fingerprinted (checkpoint) or written (steps)."""
    ws = release.workspace
    out = {
        os.path.abspath(ws.root / rel): digest
        for rec in ws.read()["steps"].values()
        for rel, digest in (rec.get("outputs") or {}).items()
    }
    ckpt = release.checkpoint
    out.update({os.path.abspath(Path(ckpt.path) / name): digest for name, digest in ckpt.files.items()})
    return out


def copy_checked(src: Path, dst: Path, expected: str | None) -> str:
    """Copy ``src`` to ``dst`` hashing the bytes as they are written (one read); ``expected`` must match."""
    with open(src, "rb") as fin:
        digest, _ = copy_hashed(fin, dst)
    if expected is not None and digest != expected:
        raise ServingError(
            f"{src}: changed since it was hashed for this release (sha256 {digest[:16]}…, recorded {expected[:16]}…). "
            "Nothing was published and nothing served changed. Run the release again from the genuine files "
            "(its steps redo what depended on them)."
        )
    return digest


def _source_digest(release: Release, digests: dict[str, str], src: Path) -> str | None:
    """The recorded hash a copied release file must have (None: not a release file, e.g. model.py)."""
    path = os.path.abspath(src)
    roots = (os.path.abspath(release.workspace.root), os.path.abspath(release.checkpoint.path))
    if path in digests:
        return digests[path]
    if any(path.startswith(root + os.sep) for root in roots):
        raise ServingError(
            f"{src}: a file of the release with no hash recorded when it was fingerprinted or written; "
            "nothing was published. Run the release again."
        )
    return None


def _write_version(
    repo: Repository,
    tmp: Path,
    version: int,
    values: dict[str, Any],
    key: str,
    release: Release,
    options: ServingOptions,
    sources: dict[str, dict[str, Path]],
) -> dict:
    judged = verdicts.published(release.workspace)
    configs = {
        m: render_config(
            repo.source,
            m,
            options,
            version=version,
            num_labels=len(values["labels"]),
            pad_id=values["pad_id"],
            names=repo.names,
            model_inputs=values[shipped.contract().MODEL_INPUTS_KEY],
        )
        for m in repo.names.models
    }
    check_configs(configs, version, repo.names, options.pipeline)
    published_at = datetime.now(UTC).isoformat(timespec="seconds")
    digests = recorded_digests(release)
    sizes = {}
    for model in repo.names.models:
        vdir = tmp / model / str(version)
        vdir.mkdir(parents=True)
        files: dict[str, str] = {}
        for name, src in sources[model].items():
            faults.point("publish:copy")
            files[name] = copy_checked(Path(src), vdir / name, _source_digest(release, digests, Path(src)))
        if "seqcls_text.py" in files and "vocab.txt" in files:  # the tokenizer's char classes, computed once
            table = shipped.text().write_char_classes(vdir / shipped.text().CHAR_CLASSES_FILE)
            files[table.name] = sha256_file(table)
        if "model.py" in files:
            (vdir / NO_BYTECODE).write_bytes(b"")
            files[NO_BYTECODE] = sha256_file(vdir / NO_BYTECODE)
        (vdir / SNAPSHOT).write_text(configs[model], encoding="utf-8")
        files[SNAPSHOT] = sha256_file(vdir / SNAPSHOT)
        if options.pipeline == "direct" and model == repo.names.ensemble:
            files.update(_direct_steps(tmp, vdir, version, configs, repo.names))
        info = {
            **values,
            "version": version,
            "model": model,
            "publish_key": key,
            "published_at": published_at,
            "workspace": str(release.workspace.root),
            "serving": options.to_dict(),
            verdicts.VERDICTS_KEY: judged,  # what status and sync check the served version went live with
            "files": files,
        }
        (vdir / RELEASE_FILE).write_text(json.dumps(info, indent=1, ensure_ascii=False), encoding="utf-8")
        sizes[model] = sum(p.stat().st_size for p in vdir.rglob("*") if p.is_file())
    return sizes


def _direct_steps(tmp: Path, vdir: Path, version: int, configs: dict[str, str], names: ServingNames) -> dict[str, str]:
    """The direct pipeline's steps inside its version: each composing model's version files (written just
    before, hashed there) under ``<step>/``, hard-linked where the volume allows, and every step's rendered
    config in :data:`DIRECT_STEPS_FILE`; relative path → sha256, for ``release.json``."""
    files: dict[str, str] = {}
    for role in DIRECT_STEPS:
        source = tmp / getattr(names, role) / str(version)
        step_dir = vdir / role
        step_dir.mkdir()
        recorded = json.loads((source / RELEASE_FILE).read_text(encoding="utf-8"))["files"]
        for path in sorted(source.iterdir()):
            target, expected = step_dir / path.name, recorded.get(path.name)
            try:
                os.link(path, target)  # the very bytes hashed when the composing model's file was written
                digest = expected or sha256_file(target)
            except OSError:  # a volume without hard links: copied, hashed as written, checked
                digest = copy_checked(path, target, expected)
            files[f"{role}/{path.name}"] = digest
    (vdir / DIRECT_STEPS_FILE).write_text(json.dumps(direct_steps(configs, names), indent=1), encoding="utf-8")
    files[DIRECT_STEPS_FILE] = sha256_file(vdir / DIRECT_STEPS_FILE)
    return files


def served_damage(repo: Repository, state: ServingState) -> str | None:
    """The served version, restored from verified copies (its pin and release workspace,
    :mod:`seqcls.serving.restore`) where it is damaged and they exist; when no copy is left, what is wrong
    with it — a release may still proceed beside what Triton holds in memory (said in the log and the
    history), and only a restarted Triton loses it. None: intact. The caller holds the repository lock."""
    problems = [] if state.serving is None else repo.problems(state.serving)
    if problems and state.serving is not None and restore.restore_version(repo, state.serving).restored:
        problems = repo.problems(state.serving)
    if not problems:
        return None
    return (
        f"served version {state.serving} of {state.model_name!r} is damaged ({'; '.join(problems[:3])}) and no "
        "verified copy of it exists (no pin records it, or its release workspace is gone too): this release "
        "proceeds; its candidate is smoke-tested beside what Triton still holds in memory (with the ensemble "
        "pipeline, loading the candidate drops that: the public route does not answer from reload until expose), "
        f"and a restarted Triton cannot load version {state.serving}"
    )


def allocate(repo: Repository, state: ServingState) -> int:
    """The next version number, recorded in the state before anything is written (caller holds the lease
    and the repository lock): above every number ever allocated, every version directory on disk and, on an
    ``s3://`` repository, every version with any object on the store (a publish that died there included)."""
    on_disk = [v for m in repo.names.all for v in repo.versions(m)]
    if (store := StoreRepository.at(repo.root)) is not None:
        on_disk += store.used_versions(repo.names.all)
    version = max([state.published, *on_disk]) + 1
    write_state(repo.root, state.allocated(version), expected_generation=state.generation)
    return version


def publish(release: Release, options: ServingOptions | None = None, *, retain: int = DEFAULT_RETAIN) -> StepResult:
    """Write (or reuse) the release's Triton version N; returns it in the summary."""
    ws = release.workspace
    validate_rec = require(release, STEP)["validate"]
    options = options or ServingOptions.from_spec(release.serving)
    repo = Repository.from_settings(release.settings, release.config.model_name)
    values = release_values(release, options)
    sources = {m: _files_for(release, m, options, repo.names) for m in repo.names.models}
    for model, files in sources.items():
        for name, path in files.items():
            if not Path(path).is_file():
                raise ServingError(f"{path}: missing — needed as {model}/<version>/{name}")
    key = publish_key(values, sources, options, repo.source, repo.names)
    inputs = {
        "validate_outputs": validate_rec["outputs"],
        "repository": str(repo.root),
        "publish_key": key,
        "serving": options.to_dict(),
        "retain": retain,
    }

    def body(out: Path) -> tuple[dict, str]:
        owner = control.release_owner(release)
        control.take_lease(repo.root, release.config.model_name, owner, STEP)
        with repo.lock(what=f"publish {release.config.model_name}"):
            state = current_state(repo.root, release.config.model_name)
            damage = served_damage(repo, state)
            if damage is not None:
                log.warning("publish: %s", damage)
                append_event(repo.root, repo.model_name, "damaged", serving=state.serving, reason=damage,
                             fingerprint=state.fingerprint_of(state.serving))  # fmt: skip
            version = find_published(repo, key)
            reused = version is not None
            if version is None:
                version = allocate(repo, state)
                tmp = repo.root / TMP_PUBLISH.format(model=repo.model_name, pid=os.getpid(), version=version)
                shutil.rmtree(tmp, ignore_errors=True)
                try:
                    try:
                        sizes = _write_version(repo, tmp, version, values, key, release, options, sources)
                    except OSError as exc:  # disk full, read-only volume...: nothing was renamed into place
                        free = shutil.disk_usage(repo.root).free
                        raise ServingError(
                            f"{repo.root}: writing version {version} failed ({exc}); {free / 1e6:.1f} MB free. Nothing "
                            "was published and nothing served changed; free space on the repository volume and retry."
                        ) from exc
                    # every file hash also kept outside the version, beside the state: a deleted version can be restored
                    write_pin(repo.root, repo.names, version, {m: tmp / m / str(version) for m in repo.names.models})
                    faults.point("publish:written")
                    for model in repo.names.models:  # composing models first, the ensemble last
                        (repo.root / model).mkdir(parents=True, exist_ok=True)
                        replace_dir(tmp / model / str(version), repo.root / model / str(version))
                        faults.point(f"publish:renamed:{model}")
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                upload(repo, version)
                log.info(
                    "publish: wrote version %d to %s (%s)",
                    version,
                    repo.root,
                    ", ".join(f"{m} {s / 1e6:.1f} MB" for m, s in sizes.items()),
                )
            else:
                log.info("publish: version %d already holds this release (files intact) — reusing it", version)
                if read_pin(repo.root, repo.model_name, version) is None:  # published before pins: pin it now
                    dirs = {m: repo.root / m / str(version) for m in repo.names.models}
                    write_pin(repo.root, repo.names, version, dirs)
            pruned = prune(repo, retain, current_state(repo.root, release.config.model_name))
        summary = Published(
            version, reused, str(repo.root), key, options.to_dict(), pruned, repo.complete_versions()
        ).to_dict()
        (out / "publish.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        msg = f"{'reused' if reused else 'published'} Triton v{version} in {repo.root}"
        return summary, msg

    return ws.run_step(STEP, inputs, body, out_dir=OUT_DIR, always_run=True)
