"""Checkpoints and release outputs built or damaged on purpose: minimal Paddle-layout checkpoints that
need no paddle, the golden texts of the tiny Hugging Face checkpoints, a converted ONNX perturbed."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np

from seqcls_tools.testing import TINY_CORPUS

#: Golden texts for the HF checkpoints: the tiny corpus plus what stresses a tokenizer (case,
#: accents, emoji, full-width forms, a text longer than max_length).
HF_GOLDEN = (
    *TINY_CORPUS[:6],
    "Café Über naïve ÉLAN 🎉 ２０２４年 ｆｕｌｌ－ｗｉｄｔｈ",
    "中国队以3比1战胜对手，获得冠军。" * 12,
    "mixed 文本 with English words and 数字 12345 ...",
)


def minimal_checkpoint(path: Path, *, seed: int = 0) -> Path:
    """A minimal checkpoint resolve_checkpoint accepts: 2 labels, 6 tokens, weights differing by ``seed``."""
    path.mkdir(parents=True)
    config = {"architectures": ["ErnieForSequenceClassification"], "num_labels": 2, "vocab_size": 6}
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "ErnieTokenizer"}), encoding="utf-8")
    (path / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[UNK]\n体\n育\n", encoding="utf-8")
    (path / "label.txt").write_text("体育\n体育##夺冠\n", encoding="utf-8")
    (path / "model_state.pdparams").write_bytes(pickle.dumps({"w": [float(seed)] * 4}, protocol=2))
    return path


def _perturb(onnx_path: Path, scale: float) -> None:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))
    biggest = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    arr = numpy_helper.to_array(biggest).copy()
    arr += np.random.default_rng(0).normal(0, scale, arr.shape).astype(arr.dtype)
    biggest.CopyFrom(numpy_helper.from_array(arr, biggest.name))
    onnx.save(model, str(onnx_path))


def perturb_converted(release, scale: float = 0.5) -> None:
    """Perturb the converted ONNX weights and record the damaged file as convert's output, so
    validate uses it — what a conversion bug would leave."""
    from seqcls.checkpoints.checkpoint import sha256_file

    onnx_path = release.workspace.root / "onnx" / "model.onnx"
    _perturb(onnx_path, scale)
    manifest = release.workspace.read()
    manifest["steps"]["convert"]["outputs"]["onnx/model.onnx"] = sha256_file(onnx_path)
    release.workspace.write(manifest)
