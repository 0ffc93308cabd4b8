"""Triton python model ``seqcls_postprocess``: logits → label names with confidences.

For every row of every request: sigmoid, per-label thresholds, optional hierarchy consistency
(a child label implies its ``##`` parent). Outputs ``predictions`` (BYTES ``[N, 1]``, a JSON list
of ``{"label", "confidence"}`` per text) and ``probabilities`` (FP32 ``[N, num_labels]``). Labels,
thresholds and the hierarchy flag come from this version's ``release.json``; the logic is
``seqcls_decide.py``, the same file the release's validate step uses.

One bad request fails only itself, with ``INVALID_ARG``: logits missing, not ``[N, num_labels]``,
or any exception while that request is decided; the others of the batch are answered. ``[0, C]``
logits give empty outputs.

Metrics (``seqcls_backend.Metrics``, names in ``seqcls_contract``): texts, texts per label,
texts with no label, near-threshold counts per label, the top confidence histogram and refused
requests, per seqcls model and version — counted by ``seqcls_decide.tally``, the same function
that computes the release's reference distribution. Labels beyond ``release.json``'s
``metric_labels`` share one series.
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
        metric_labels = release.get(contract.METRIC_LABELS_KEY)
        if metric_labels is None and len(self.labels) > contract.MAX_LABEL_SERIES:
            metric_labels = self.labels[: contract.MAX_LABEL_SERIES - 1]
        self.metrics = backend.Metrics(
            contract,
            release.get("model_name", "seqcls"),
            args["model_version"],
            self.labels,
            metric_labels,
            enabled=backend.param(json.loads(args["model_config"]), "metrics", "on") != "off",
        )
        self.metrics.declare_postprocess()

    def _answer(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, contract.LOGITS_OUTPUT)
        if tensor is None:
            self.metrics.rejected("missing_input")
            return backend.invalid(f"seqcls_postprocess: the request has no {contract.LOGITS_OUTPUT} input")
        logits = tensor.as_numpy()
        if logits.ndim != 2 or logits.shape[1] != len(self.labels):
            self.metrics.rejected("bad_logits")
            return backend.invalid(
                f"seqcls_postprocess: logits shape {list(logits.shape)}, expected [N, {len(self.labels)}]"
            )
        probs = seqcls_decide.sigmoid(logits)
        rows = seqcls_decide.decide(probs, self.thresholds, self.labels, hierarchy=self.hierarchy)
        counted = seqcls_decide.tally(
            rows, probs, self.thresholds, contract.NEAR_THRESHOLD_MARGIN, contract.CONFIDENCE_BUCKETS
        )
        payload = np.empty((len(rows), 1), dtype=object)
        for i, row in enumerate(rows):
            payload[i, 0] = json.dumps(
                [{"label": lbl, "confidence": round(c, 6)} for lbl, c in row], ensure_ascii=False
            ).encode("utf-8")
        response = pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor(contract.PREDICTIONS_OUTPUT, payload),
                pb_utils.Tensor(contract.PROBABILITIES_OUTPUT, probs.astype(np.float32)),
            ]
        )
        self.metrics.tally(counted, self.labels)  # counted once the answer exists: refused requests are not texts
        return response

    def finalize(self):
        self.metrics.close()

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except Exception as exc:
                backend.log_unexpected("seqcls_postprocess: one request")
                self.metrics.rejected("internal")
                responses.append(backend.invalid(f"seqcls_postprocess: {type(exc).__name__}: {exc}"))
        return responses
