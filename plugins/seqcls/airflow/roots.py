"""Where a DAG run may take its checkpoint from: under its model's checkpoints root, nowhere else.

Whoever may trigger a DAG run is not necessarily whoever may read every file the workers can: a
release reads, hashes, converts and uploads (MLflow artifacts) every file of the checkpoint it is
given. So the root is a **deployment** decision — the model's ``checkpoints_root`` in the models
file, under (or at) ``SEQCLS_CHECKPOINTS_ROOT`` — passed to the tasks when the DAG file is parsed,
never a run param. The ``checkpoint`` param (absolute, relative to the root, or ``latest``) must
*resolve* — symlinks followed, ``..`` collapsed — to the root or a directory under it; so must
what ``latest`` finds (a symlinked candidate leaving the root is refused, not followed). The CLI
does not go through here: it runs as its user, with that user's own file access.

Imports nothing from Airflow (the heavy tasks call it from another interpreter).
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath

from seqcls.errors import InputError
from seqcls.release.completion import find_latest
from seqcls.settings import ENV_CHECKPOINTS_ROOT, Settings

log = logging.getLogger("seqcls.airflow")

LATEST = "latest"
#: The run param that once chose the root; refused now, naming the setting that does.
ROOT_PARAM = "checkpoints_root"
HOW_TO_FIX = (
    "copy the checkpoint under that root (symlinks leaving it do not count), or ask an operator to set this "
    f"model's checkpoints_root in the models file / {ENV_CHECKPOINTS_ROOT} to a root that contains it"
)


def model_root(value: str | Path | None, base: Path) -> Path:
    """A model's configured checkpoints root: empty = ``base`` (``SEQCLS_CHECKPOINTS_ROOT``), relative =
    under it (no ``..``), absolute = itself."""
    text = str(value or "").strip()
    if not text:
        return Path(base)
    path = Path(text).expanduser()
    if path.is_absolute():
        return path
    if ".." in PurePosixPath(text).parts:
        raise InputError(f"{ROOT_PARAM} {text!r}: '..' is not allowed in a path relative to {ENV_CHECKPOINTS_ROOT}")
    return Path(base) / path


def refuse_root_param(values: dict) -> None:
    """A run conf may not choose the root (older triggers sent ``checkpoints_root``): say who does."""
    if ROOT_PARAM in values:
        raise InputError(
            f"{ROOT_PARAM} {values[ROOT_PARAM]!r} is not a run param: a model's checkpoints root is set by the "
            f"deployment (models file `checkpoints_root`, {ENV_CHECKPOINTS_ROOT}); drop it from the run conf and "
            "give `checkpoint` as a path under that root (or 'latest')"
        )


def confine(path: Path, root: Path, *, param: str, given: str) -> Path:
    """``path`` resolved (symlinks followed) when it is ``root`` or under it, else InputError naming ``param``."""
    top = Path(root).expanduser().resolve()
    real = Path(path).expanduser().resolve()
    if real.is_relative_to(top):
        return real
    raise InputError(
        f"{param} {given!r} resolves to {real}, which is outside this model's checkpoints root {top}: a DAG run "
        f"releases only checkpoints under its model's root. To release it, {HOW_TO_FIX}."
    )


def locate_checkpoint(value: str | None, settings: Settings, *, param: str = "checkpoint") -> Path:
    """The ``checkpoint`` param as a directory under the checkpoints root (resolved): absolute, relative to
    the root, or ``latest`` (the checkpoint there its training job marked complete last, see
    ``seqcls.release.completion``). Anything resolving outside the root is refused, naming ``param``."""
    text = (value or "").strip()
    if not text:
        raise InputError(f"{param} is empty: give a checkpoint directory under the checkpoints root, or 'latest'")
    root = Path(settings.checkpoints_root or ".")
    if text == LATEST:
        found = find_latest(root)
        try:
            path = confine(found, root, param=param, given=LATEST)
        except InputError as exc:
            raise InputError(f"{exc} ('latest' under {root} is {found}: a symlink leaving the root)") from None
        log.info("checkpoint 'latest' under %s → %s", root, path)
        return path
    path = Path(text).expanduser()
    return confine(path if path.is_absolute() else root / path, root, param=param, given=text)


__all__ = ["LATEST", "ROOT_PARAM", "confine", "locate_checkpoint", "model_root", "refuse_root_param"]
