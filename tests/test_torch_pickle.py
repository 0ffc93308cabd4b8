"""``pytorch_model.bin`` checkpoints (single or sharded): read through a static scan and PyTorch's restricted
unpickler, kept in the snapshot as ``model.safetensors``; hostile files refused with nothing executed.

The hostile files are real ``torch.save`` archives whose ``data.pkl`` is replaced by the payloads of the
``.pdparams`` tests (a reduce to ``os.system``, ``eval`` through ``STACK_GLOBAL``, a class) plus one only a
torch file can carry (a persistent id that is not a storage); each would create a marker file if it ran.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from seqcls.checkpoints import snapshot
from seqcls.checkpoints.torchload import TORCH_INDEX, TORCH_WEIGHTS, load_state_dict, scan_torch_file
from seqcls.config import ReleaseConfig
from seqcls.errors import CheckpointError
from seqcls.release.intake import directory_fingerprint, open_release, reopen_release, resolve_checkpoint
from seqcls.settings import Settings
from tests.helpers.drills import Drill

pytest.importorskip("torch", reason="the torch extra (make setup-torch) is not installed")
pytestmark = pytest.mark.slow  # the session fixtures build real (tiny) torch checkpoints


class _Reduce:
    """Pickles as ``func(*args)``: what an attacker's ``__reduce__`` looks like."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


class _PersistentId(pickle.Pickler):
    """Writes the string ``"marker"`` as a persistent id the way torch.save writes storages (BINPERSID)."""

    def persistent_id(self, obj):
        return ("storage-not", f"touch {self.marker}") if obj == "marker" else None


def _persistent_id(marker: Path) -> bytes:
    buf = io.BytesIO()
    pickler = _PersistentId(buf, protocol=2)
    pickler.marker = marker
    pickler.dump({"bert.embeddings.word_embeddings.weight": "marker"})
    return buf.getvalue()


def _module_class() -> type:
    import torch

    return torch.nn.Linear


PAYLOADS = {
    "os-system-reduce": (lambda m: pickle.dumps({"w": _Reduce(os.system, f"touch {m}")}, 2), r"(posix|os)\.system"),
    "eval-stack-global": (
        lambda m: pickle.dumps({"w": _Reduce(eval, f"__import__('os').system('touch {m}')")}, 4),
        r"builtins\.eval",
    ),
    "a-class": (
        lambda m: pickle.dumps({"w": _module_class(), "cmd": f"touch {m}"}, 2),
        r"torch\.nn\.modules\.linear\.Linear",
    ),
    "persistent-id": (_persistent_id, r"restricted unpickler .*Only persistent_load of storage is allowed"),
}


def _rewrite_pickle(bin_file: Path, payload: bytes) -> None:
    """``bin_file`` (a torch.save zip) with its ``data.pkl`` replaced by ``payload``, every other member kept."""
    src = zipfile.ZipFile(io.BytesIO(bin_file.read_bytes()))
    with zipfile.ZipFile(bin_file, "w", zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            out.writestr(info.filename, payload if info.filename.endswith("/data.pkl") else src.read(info))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


# ----------------------------------------------------------------------------- accepted, converted


@pytest.mark.parametrize("arch", ["bert", "deberta-v2"])
def test_a_pickled_checkpoint_is_taken_in_as_safetensors(
    hf_pickle_checkpoints_src: dict[str, Path], hf_checkpoints_src: dict[str, Path], arch: str
) -> None:
    src = hf_pickle_checkpoints_src[arch]
    sources = sorted(p.name for p in src.iterdir() if p.name.startswith("pytorch_model"))
    assert (len(sources) > 2) == (arch == "deberta-v2"), sources  # deberta-v2 is the sharded one
    release = open_release(src, ReleaseConfig(model_name=f"pickled-{arch}"))
    ckpt, snap = release.checkpoint, release.checkpoint.path
    # the snapshot holds safetensors only; its record says what from (the sha256 of the bytes taken in)
    assert ckpt.weights == snap / "model.safetensors"
    assert not [p.name for p in snap.iterdir() if p.name.startswith("pytorch_model")]
    taken = snapshot.verify(snap)
    how = taken.converted["model.safetensors"]
    assert how["from"] == {n: hashlib.sha256((src / n).read_bytes()).hexdigest() for n in sources}
    assert how["loader"] == "torch.load(weights_only=True)"
    # the fingerprint is over the files as trained: the operator's directory and the snapshot agree
    assert ckpt.fingerprint == directory_fingerprint(src) == resolve_checkpoint(src).fingerprint
    assert ckpt.converted == how and release.workspace.read()["checkpoint"]["converted"] == how
    # bit for bit the tensors the same model saved as safetensors holds
    twin, converted = _tensors(hf_checkpoints_src[arch] / "model.safetensors"), _tensors(ckpt.weights)
    assert sorted(twin) == sorted(converted)
    assert all(twin[k].dtype == converted[k].dtype and bool((twin[k] == converted[k]).all()) for k in twin)
    # a later task reopens the verified snapshot with the same fingerprint; a changed copy is refused
    again = reopen_release(Settings.from_env(), release.config, ckpt.fingerprint)
    assert again.checkpoint.fingerprint == ckpt.fingerprint and again.checkpoint.converted == how
    with open(ckpt.weights, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: damaged in the checkpoint snapshot"):
        snapshot.verify(snap)


def test_the_same_checkpoint_taken_in_twice_converts_to_the_same_bytes(
    hf_pickle_checkpoints_src: dict[str, Path], tmp_path: Path
) -> None:
    """Conversion is deterministic, so a workspace's kept snapshot is recognised on the next run."""
    src = hf_pickle_checkpoints_src["bert"]
    first = open_release(src, ReleaseConfig(model_name="twice")).checkpoint
    other = open_release(_copy(src, tmp_path / "moved"), ReleaseConfig(model_name="twice")).checkpoint
    assert first.fingerprint == other.fingerprint
    assert first.files["model.safetensors"] == other.files["model.safetensors"]


# ----------------------------------------------------------------------------- refused, nothing runs


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_hostile_pytorch_model_bin_is_refused_before_anything_runs(
    hf_pickle_checkpoints_src: dict[str, Path], tmp_path: Path, name: str
) -> None:
    make, expected = PAYLOADS[name]
    marker = tmp_path / "pwned"
    ckpt = _copy(hf_pickle_checkpoints_src["bert"], tmp_path / "ckpt")
    _rewrite_pickle(ckpt / TORCH_WEIGHTS, make(marker))
    with pytest.raises(CheckpointError) as err:
        open_release(ckpt, ReleaseConfig(model_name="hostile"))
    message = str(err.value)
    assert f"{ckpt / TORCH_WEIGHTS}: refused to load" in message, message  # the operator's file, not the copy
    assert "save_pretrained(safe_serialization=True)" in message
    assert re.search(expected, message), message
    if name != "persistent-id":  # the first lock caught it: the static scan, before torch read a byte
        assert "which torch.save never writes for a state dict" in message, message
    assert not marker.exists()
    assert not list((Settings.from_env().releases_dir / "hostile").glob("*/checkpoint")), "no workspace was made"


def test_the_restricted_unpickler_is_a_second_lock(hf_pickle_checkpoints_src: dict[str, Path], tmp_path: Path) -> None:
    """Loaded without the static scan, a reduce to os.system is still refused by torch's unpickler."""
    marker = tmp_path / "pwned"
    bin_file = tmp_path / TORCH_WEIGHTS
    shutil.copyfile(hf_pickle_checkpoints_src["bert"] / TORCH_WEIGHTS, bin_file)
    _rewrite_pickle(bin_file, pickle.dumps({"w": _Reduce(os.system, f"touch {marker}")}, 2))
    with pytest.raises(CheckpointError, match=r"restricted unpickler .*GLOBAL (posix|os)\.system"):
        load_state_dict(bin_file)
    assert not marker.exists()


def test_a_state_dict_holding_something_else_than_tensors_is_refused(tmp_path: Path) -> None:
    import torch

    path = tmp_path / TORCH_WEIGHTS
    torch.save({"w": torch.ones(2), "step": 3}, path)
    scan_torch_file(path)  # plain values pass the scan and torch's unpickler
    with pytest.raises(CheckpointError, match=r"entry 'step' is a int, not a tensor"):
        load_state_dict(path)
    torch.save([torch.ones(2)], path)
    with pytest.raises(CheckpointError, match="holds a list, not a state dict"):
        load_state_dict(path)


def test_legacy_truncated_and_foreign_files_are_clear_errors(tmp_path: Path) -> None:
    import torch

    path = tmp_path / TORCH_WEIGHTS
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"legacy \(pre-1\.6, not zip\) format"):
        scan_torch_file(path)
    torch.save({"w": torch.ones(2)}, path)
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        scan_torch_file(path)
    path.write_bytes(b"GGUF not a torch file")
    with pytest.raises(CheckpointError, match="not a PyTorch weights file"):
        scan_torch_file(path)


def test_sharded_checkpoints_must_be_whole_and_inside(
    hf_pickle_checkpoints_src: dict[str, Path], tmp_path: Path
) -> None:
    src = hf_pickle_checkpoints_src["deberta-v2"]
    index = json.loads((src / TORCH_INDEX).read_text(encoding="utf-8"))
    shard = sorted(set(index["weight_map"].values()))[-1]

    missing = _copy(src, tmp_path / "missing")
    (missing / shard).unlink()
    with pytest.raises(CheckpointError, match=rf"{shard}: missing — .*{TORCH_INDEX} lists it"):
        open_release(missing, ReleaseConfig(model_name="shards"))

    outside = _copy(src, tmp_path / "outside")
    (tmp_path / "elsewhere.bin").write_bytes(b"x")
    edited = {**index, "weight_map": {**index["weight_map"], "classifier.bias": "../elsewhere.bin"}}
    (outside / TORCH_INDEX).write_text(json.dumps(edited), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"weight_map\['classifier\.bias'\] names '\.\./elsewhere\.bin'"):
        open_release(outside, ReleaseConfig(model_name="shards"))

    moved = _copy(src, tmp_path / "moved")
    first = sorted(set(index["weight_map"].values()))[0]
    key = next(k for k, v in index["weight_map"].items() if v == first)
    edited = {**index, "weight_map": {**index["weight_map"], key: shard}}
    (moved / TORCH_INDEX).write_text(json.dumps(edited), encoding="utf-8")
    with pytest.raises(CheckpointError, match=rf"holds tensor '{key}', which .* puts in '{shard}'"):
        open_release(moved, ReleaseConfig(model_name="shards"))

    both = _copy(src, tmp_path / "both")
    shutil.copyfile(hf_pickle_checkpoints_src["bert"] / TORCH_WEIGHTS, both / TORCH_WEIGHTS)
    with pytest.raises(CheckpointError, match=rf"both {TORCH_WEIGHTS} and {TORCH_INDEX}"):
        resolve_checkpoint(both)


def test_a_paddle_checkpoint_with_pytorch_weights_is_refused(
    tiny_checkpoint: Path, hf_pickle_checkpoints_src: dict[str, Path]
) -> None:
    (tiny_checkpoint / "model_state.pdparams").unlink()
    shutil.copyfile(hf_pickle_checkpoints_src["bert"] / TORCH_WEIGHTS, tiny_checkpoint / TORCH_WEIGHTS)
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: PyTorch weights in a PaddleNLP checkpoint"):
        resolve_checkpoint(tiny_checkpoint)


# ----------------------------------------------------------------------------- through every gate


@pytest.mark.integration
def test_pickled_checkpoints_release_through_every_gate(
    drill: Drill, hf_pickle_checkpoints_src: dict[str, Path]
) -> None:
    """A tiny BERT (pytorch_model.bin) and a tiny DeBERTa-v2 (sharded) go live on Triton and are registered;
    the published version and the registry see safetensors only, and say the checkpoint was converted."""
    from seqcls.contract.names import ModelName
    from seqcls.registry.ledger import CHAMPION, aliased_version, client

    for arch, model in (("bert", "bertbin"), ("deberta-v2", "debertabin")):
        src = hf_pickle_checkpoints_src[arch]
        results = drill.release(src, model_name=model)
        assert [r.step for r in results][-1] == "promote", results
        champion = aliased_version(client(drill.settings), model, CHAMPION)
        assert champion is not None and champion.tags["fingerprint"] == directory_fingerprint(src)
        assert champion.tags["checkpoint.converted"].endswith("-> model.safetensors (torch.load(weights_only=True))")
        published = [p.name for p in drill.repo.rglob("*") if ModelName(model).names.tokenizer in p.parts]
        assert published and not [n for n in published if n.endswith(".bin")], published
    drill.assert_invariant()
