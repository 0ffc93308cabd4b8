"""Pickled weights are scanned statically: a hostile ``.pdparams`` is refused and nothing runs."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from seqcls.checkpoints.safeload import ALLOWED_GLOBALS, scan_pickle
from seqcls.errors import CheckpointError
from seqcls.release.intake import resolve_checkpoint

pytestmark = pytest.mark.slow  # the session fixture builds a real (tiny) paddle checkpoint

WEIGHTS = "model_state.pdparams"


class _Reduce:
    """Pickles as ``func(*args)``: what an attacker's ``__reduce__`` looks like."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def _touch(marker: Path) -> str:
    return f"touch {marker}"


def _hostile(ckpt: Path, payload: bytes) -> Path:
    weights = ckpt / WEIGHTS
    weights.write_bytes(payload)
    return weights


def _os_system_pickle(marker: Path, protocol: int = 4) -> bytes:
    return pickle.dumps({"ernie.embeddings.word_embeddings.weight": _Reduce(os.system, _touch(marker))}, protocol)


# (1) real files pass ----------------------------------------------------------------------------


def test_tiny_checkpoint_weights_pass(tiny_checkpoint: Path) -> None:
    scan_pickle(tiny_checkpoint / WEIGHTS)
    ckpt = resolve_checkpoint(tiny_checkpoint)
    assert ckpt.weights.name == WEIGHTS and ckpt.num_labels == 7


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_real_paddle_save_of_a_state_dict_passes(tmp_path: Path, protocol: int) -> None:
    import paddle

    layer = paddle.nn.Linear(3, 2)
    path = tmp_path / f"linear_p{protocol}.pdparams"
    paddle.save(layer.state_dict(), str(path), protocol=protocol)
    scan_pickle(path)
    # Tensors (not ndarrays) nested in a plain dict: paddle writes builtins.tuple((name, ndarray)).
    paddle.save({"w": layer.weight, "meta": {"step": 3}}, str(tmp_path / "mixed.pdparams"), protocol=protocol)
    scan_pickle(tmp_path / "mixed.pdparams")


def test_plain_numpy_state_dict_passes(tmp_path: Path) -> None:
    import collections

    import numpy as np

    state = collections.OrderedDict(w=np.ones((2, 3), dtype="float32"), b=np.zeros(2, dtype="int64"))
    for protocol in (2, 3, 4):  # paddle.save accepts 2..4; numpy writes _frombuffer for 5, not admitted
        path = tmp_path / f"np{protocol}.pdparams"
        path.write_bytes(pickle.dumps(state, protocol))
        scan_pickle(path)


# (2) the hostile file: refused at the checkpoint step, nothing runs -------------------------------


def test_hostile_pickle_refused_at_resolve(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from seqcls.release.intake import open_release

    marker = tmp_path / "pwned"
    weights = _hostile(tiny_checkpoint, _os_system_pickle(marker))
    with pytest.raises(CheckpointError) as err:
        open_release(tiny_checkpoint)
    msg = str(err.value)
    assert str(weights) in msg and ("posix.system" in msg or "os.system" in msg)
    assert "safetensors" in msg and "SEQCLS_ALLOW_UNSAFE_PICKLE=1" in msg
    assert not marker.exists()


def test_hostile_pickle_refused_by_run_release_until_export(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from seqcls.release.intake import open_release
    from seqcls.steps import run_release

    marker = tmp_path / "pwned"
    _hostile(tiny_checkpoint, _os_system_pickle(marker))
    with pytest.raises(CheckpointError, match=r"(posix|os)\.system"):
        run_release(open_release(tiny_checkpoint), until="export")
    assert not marker.exists()


def test_weights_swapped_after_resolve_refused_by_export(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The export step scans again: the release's own copy (its snapshot) is what export reads, and even
    that is scanned again before unpickling (the checkpoint directory itself is never read again)."""
    from seqcls.release.intake import open_release
    from seqcls.steps import run_release

    marker = tmp_path / "pwned"
    release = open_release(tiny_checkpoint)  # clean at resolve time
    _hostile(tiny_checkpoint, _os_system_pickle(marker))  # never read again
    weights = _hostile(release.checkpoint.path, _os_system_pickle(marker))  # the release's copy tampered with
    with pytest.raises(CheckpointError, match=r"(posix|os)\.system") as err:
        run_release(release, until="export")
    assert str(weights) in str(err.value)
    assert not marker.exists()


def test_hostile_pickle_cli_export_exits_1(tiny_checkpoint: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    _hostile(tiny_checkpoint, _os_system_pickle(marker))
    proc = subprocess.run(
        [sys.executable, "-m", "seqcls.cli", "export", "--checkpoint", str(tiny_checkpoint)],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ.copy(),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "system" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


# (3) variants ------------------------------------------------------------------------------------


def _stack_global_eval(marker: Path) -> bytes:
    return pickle.dumps({"w": _Reduce(eval, f"__import__('os').system('touch {marker}')")}, protocol=4)


def _popen(marker: Path) -> bytes:
    return pickle.dumps({"w": _Reduce(subprocess.Popen, ["touch", str(marker)])}, protocol=2)


def _hidden_behind_memo(marker: Path) -> bytes:
    """``STACK_GLOBAL`` whose strings come from the memo (BINPUT/BINGET), after harmless ones."""
    return (
        b"\x80\x04"
        + b"\x8c\x05numpy\x94"  # memo 0 = 'numpy'
        + b"\x8c\x07ndarray\x94"  # memo 1 = 'ndarray'
        + b"0"  # POP 'ndarray'
        + b"0"  # POP 'numpy'
        + b"\x8c\x02os\x94"  # memo 2 = 'os'
        + b"\x8c\x06system\x94"  # memo 3 = 'system'
        + b"00"
        + b"h\x02h\x03\x93"  # BINGET 2, BINGET 3, STACK_GLOBAL -> os.system
        + b"\x8c"
        + bytes([len(_touch(marker))])
        + _touch(marker).encode()
        + b"\x85R."
    )


def _computed_name(marker: Path) -> bytes:
    """``STACK_GLOBAL`` whose module is not a literal string (built by a call): cannot be known statically."""
    # numpy.dtype('os').name would not be 'os', but the scanner cannot know — it must refuse.
    return b"\x80\x04\x8c\x05numpy\x8c\x05dtype\x93\x8c\x02os\x85R\x8c\x06system\x93\x8c\x01x\x85R."


def _inst(marker: Path) -> bytes:
    return b"(S'" + _touch(marker).encode() + b"'\nios\nsystem\n."


def _ext(marker: Path) -> bytes:
    return b"\x80\x02\x82\x01."  # EXT1: a copyreg extension code resolves to an arbitrary global


@pytest.mark.parametrize(
    "make, expected",
    [
        (_stack_global_eval, r"builtins\.eval"),
        (_popen, r"subprocess\.Popen"),
        (_hidden_behind_memo, r"(posix|os)\.system"),
        (_computed_name, r"cannot be determined statically"),
        (_inst, r"os\.system"),
        (_ext, r"EXT1"),
    ],
    ids=["eval-stack-global-p4", "popen-p2", "memo", "computed", "inst-p0", "ext1"],
)
def test_variants_refused(tiny_checkpoint: Path, tmp_path: Path, make, expected: str) -> None:
    marker = tmp_path / "pwned"
    weights = tiny_checkpoint / WEIGHTS
    payload = make(marker)
    if not payload.startswith(b"\x80"):  # protocol 0 has no PROTO marker: scan the file directly
        weights.write_bytes(payload)
        with pytest.raises(CheckpointError, match=expected):
            scan_pickle(weights)
    else:
        weights.write_bytes(payload)
        with pytest.raises(CheckpointError, match=expected) as err:
            resolve_checkpoint(tiny_checkpoint)
        assert str(weights) in str(err.value)
    assert not marker.exists()


def test_zip_archive_refused(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """paddle.save never writes zip (torch does); a zip holding a hostile data.pkl is refused."""
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", _os_system_pickle(marker))
    weights = tiny_checkpoint / WEIGHTS
    weights.write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError, match=str(weights)):
        resolve_checkpoint(tiny_checkpoint)
    with pytest.raises(CheckpointError, match="zip"):
        scan_pickle(weights)
    assert not marker.exists()


# (4) garbage ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cut",
    [
        lambda data: data[: len(data) // 2] + b".",  # truncated, STOP appended: passes the cheap check
        lambda data: b"\x80\x04" + bytes(range(0x80, 0xC0)) + b".",  # garbage
        lambda data: b"\x80\x04\xff\xfe\xfd.",  # unknown opcodes
        lambda data: b"\x80\x04t.",  # TUPLE without a MARK
    ],
    ids=["truncated", "random", "bad-opcode", "underflow"],
)
def test_garbage_is_a_clear_checkpoint_error(tiny_checkpoint: Path, cut) -> None:
    weights = tiny_checkpoint / WEIGHTS
    weights.write_bytes(cut(weights.read_bytes()))
    with pytest.raises(CheckpointError, match=str(weights)):
        resolve_checkpoint(tiny_checkpoint)


def test_allowlist_is_only_array_types() -> None:
    assert not {g for g in ALLOWED_GLOBALS if g.split(".")[0] in {"os", "posix", "subprocess", "sys"}}
    assert "builtins.eval" not in ALLOWED_GLOBALS and "builtins.getattr" not in ALLOWED_GLOBALS


def test_clean_copy_still_exports_scan(tiny_checkpoint_src: Path, tmp_path: Path) -> None:
    """The scan does not touch the file: its bytes (and so the fingerprint) are unchanged."""
    dst = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint_src, dst)
    before = (dst / WEIGHTS).read_bytes()
    resolve_checkpoint(dst)
    assert (dst / WEIGHTS).read_bytes() == before


def test_unsafe_opt_in_is_off_by_default_and_logged_loudly(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "pwned"
    weights = _hostile(tiny_checkpoint, _os_system_pickle(marker))
    monkeypatch.delenv("SEQCLS_ALLOW_UNSAFE_PICKLE", raising=False)
    with pytest.raises(CheckpointError):
        scan_pickle(weights)
    monkeypatch.setenv("SEQCLS_ALLOW_UNSAFE_PICKLE", "0")
    with pytest.raises(CheckpointError):
        scan_pickle(weights)
    with pytest.raises(CheckpointError):
        scan_pickle(weights, allow_unsafe=False)
    with pytest.raises(CheckpointError, match="SEQCLS_ALLOW_UNSAFE_PICKLE=1 on the worker"):
        scan_pickle(weights, allow_unsafe=True)  # the release asks, the machine does not permit
    monkeypatch.setenv("SEQCLS_ALLOW_UNSAFE_PICKLE", "1")
    with pytest.raises(CheckpointError):
        scan_pickle(weights)  # the machine permits, the release does not ask
    with caplog.at_level("WARNING", logger="seqcls.checkpoints.safeload"):
        scan_pickle(weights, allow_unsafe=True)  # skipped: nothing is loaded here, so still nothing runs
    assert any("UNSAFE" in r.getMessage() and str(weights) in r.getMessage() for r in caplog.records)
    assert not marker.exists()


def test_unsafe_param_alone_does_not_open_the_door(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DAG triggerer asking for allow_unsafe_pickle gets a refusal naming the operator's setting."""
    from seqcls.config import ReleaseConfig
    from seqcls.release.intake import open_release

    marker = tmp_path / "pwned"
    _hostile(tiny_checkpoint, _os_system_pickle(marker))
    monkeypatch.delenv("SEQCLS_ALLOW_UNSAFE_PICKLE", raising=False)
    with pytest.raises(CheckpointError, match="SEQCLS_ALLOW_UNSAFE_PICKLE=1"):
        open_release(tiny_checkpoint, ReleaseConfig(allow_unsafe_pickle=True))
    assert not marker.exists()


@pytest.mark.parametrize(
    "index", ["model_state.pdparams.index.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"]
)
def test_a_weight_index_beside_the_scanned_weights_is_refused(
    tiny_checkpoint: Path, tmp_path: Path, index: str
) -> None:
    """PaddleNLP's from_pretrained prefers a shard index over model_state.pdparams: a benign, scanned
    model_state.pdparams next to an index naming a hostile shard would run the shard's pickle."""
    from seqcls.release.intake import open_release
    from seqcls.steps import run_release

    marker = tmp_path / "pwned"
    stem, _, ext = index.removesuffix(".index.json").partition(".")
    shard = f"{stem}-00001-of-00001.{ext}"
    (tiny_checkpoint / shard).write_bytes(_os_system_pickle(marker))
    weight_map = {"ernie.embeddings.word_embeddings.weight": shard}
    (tiny_checkpoint / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}), encoding="utf-8")
    with pytest.raises(CheckpointError, match=index.replace(".", r"\.")):
        run_release(open_release(tiny_checkpoint), until="export")
    assert not marker.exists()


def test_both_weight_files_are_ambiguous(tiny_checkpoint: Path) -> None:
    """PaddleNLP would load model.safetensors while seqcls scanned and fingerprinted model_state.pdparams."""
    (tiny_checkpoint / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointError, match=r"both model_state\.pdparams and model\.safetensors"):
        resolve_checkpoint(tiny_checkpoint)
