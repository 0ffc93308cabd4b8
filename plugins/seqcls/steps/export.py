"""Step 1 — export: the checkpoint → what convert turns into the served ONNX graph.

The checkpoint's framework adapter does the work (:mod:`seqcls.frameworks`): a PaddleNLP
checkpoint becomes a static graph (``paddle.jit.to_static`` + ``jit.save``: PIR
``static/float32.{json,pdiparams}``, :mod:`seqcls.frameworks.paddle`); a Hugging Face
``transformers`` checkpoint is exported by PyTorch straight to ONNX (``static/model.onnx``,
:mod:`seqcls.frameworks.transformers`) together with the ``tokenizer.json`` Triton will serve;
convert then verifies and optimises it like paddle2onnx's output.
"""

from __future__ import annotations

from pathlib import Path

from seqcls.frameworks import for_checkpoint
from seqcls.release.records import OUT_DIRS
from seqcls.release.workspace import Release, StepResult

STEP = "export"
OUT_DIR = OUT_DIRS[STEP]


def export(release: Release) -> StepResult:
    """Export the checkpoint to ``<workspace>/static/float32.{json,pdiparams}`` (PaddleNLP) or
    ``static/model.onnx`` (transformers)."""
    ckpt, cfg, settings = release.checkpoint, release.config, release.settings
    framework = for_checkpoint(ckpt)
    inputs = framework.export_inputs(ckpt, cfg, settings)

    def body(out: Path) -> tuple[dict, str]:
        return framework.export(ckpt, out, rel=OUT_DIR, config=cfg, settings=settings)

    return release.workspace.run_step(STEP, inputs, body, out_dir=OUT_DIR)
