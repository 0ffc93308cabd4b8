"""The Triton model names of the served ensemble, and the order they load in.

The classic ensemble shape: ``tokenizer`` (python) → ``seqcls_model`` (ONNX) →
``seqcls_postprocess`` (python), composed by the ``seqcls`` ensemble. Composing models load
before the ensemble that pins them and unload after it.

``seqcls_candidate`` is the route a release is smoke-tested on: an ensemble of its own name,
pinned to the candidate version, so clients of the public ``seqcls`` (unpinned, which Triton
answers with the highest *loaded* version) never reach an un-smoked model.
"""

from __future__ import annotations

ENSEMBLE = "seqcls"
TOKENIZER = "tokenizer"
MODEL = "seqcls_model"
POSTPROCESS = "seqcls_postprocess"
COMPOSING = (TOKENIZER, MODEL, POSTPROCESS)
MODELS = (*COMPOSING, ENSEMBLE)
CANDIDATE_ENSEMBLE = "seqcls_candidate"
