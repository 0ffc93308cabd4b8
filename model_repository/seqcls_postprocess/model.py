"""Triton python model ``seqcls_postprocess``: logits → label names with confidences.

For every row of every request: sigmoid, per-label thresholds, optional hierarchy consistency
(a child label implies its ``##`` parent). Outputs ``predictions`` (BYTES ``[N, 1]``, a JSON list
of ``{"label", "confidence"}`` per text) and ``probabilities`` (FP32 ``[N, num_labels]``). Labels,
thresholds and the hierarchy flag come from this version's ``release.json``; the logic is
``seqcls_decide.py``, the same file the release's validate step uses.

One bad request fails only itself, with ``INVALID_ARG``: logits missing, not ``[N, num_labels]``,
or any exception while that request is decided; the others of the batch are answered. ``[0, C]``
logits give empty outputs.
"""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seqcls_backend as backend
import seqcls_contract as contract
import seqcls_decide


class TritonPythonModel:
    def initialize(self, args):
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, contract.RELEASE_FILE), encoding="utf-8") as fh:
            release = json.load(fh)
        self.labels = list(release["labels"])
        self.thresholds = np.asarray(release["thresholds"], dtype=np.float32)
        self.hierarchy = bool(release.get("hierarchy", True))
        if len(self.thresholds) != len(self.labels):
            raise pb_utils.TritonModelException("release.json: thresholds and labels differ in length")

    def _answer(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, contract.LOGITS_OUTPUT)
        if tensor is None:
            return backend.invalid(f"seqcls_postprocess: the request has no {contract.LOGITS_OUTPUT} input")
        logits = tensor.as_numpy()
        if logits.ndim != 2 or logits.shape[1] != len(self.labels):
            return backend.invalid(
                f"seqcls_postprocess: logits shape {list(logits.shape)}, expected [N, {len(self.labels)}]"
            )
        probs = seqcls_decide.sigmoid(logits)
        rows = seqcls_decide.decide(probs, self.thresholds, self.labels, hierarchy=self.hierarchy)
        payload = np.empty((len(rows), 1), dtype=object)
        for i, row in enumerate(rows):
            payload[i, 0] = json.dumps(
                [{"label": lbl, "confidence": round(c, 6)} for lbl, c in row], ensure_ascii=False
            ).encode("utf-8")
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor(contract.PREDICTIONS_OUTPUT, payload),
                pb_utils.Tensor(contract.PROBABILITIES_OUTPUT, probs.astype(np.float32)),
            ]
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except Exception as exc:
                backend.log_unexpected("seqcls_postprocess: one request")
                responses.append(backend.invalid(f"seqcls_postprocess: {type(exc).__name__}: {exc}"))
        return responses
