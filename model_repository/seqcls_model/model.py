"""Triton python model ``seqcls_model`` (runtime ``python-onnxruntime``): the ONNX classifier.

Same inputs/outputs as Triton's native ``onnxruntime`` backend, for servers without it (the
local ``tritonserver`` from the nvidia-pytriton wheel, CI). ORT options come from config
parameters. ``batching`` decides how the requests of a dynamic batch run, because on CPU the
cost follows padded tokens:
- ``per-request``: one ORT run per request, no cross-request padding (CPU default);
- ``group-by-length``: requests with the same sequence length (e.g. tokenizer ``buckets``) are
  concatenated into one run;
- ``pad-to-longest``: every request padded to the batch's longest and run once (GPU style).
"""

import json
import os
import sys

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seqcls_contract as contract

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
STRATEGIES = contract.BATCHINGS
assert set(_LEVELS) == set(contract.GRAPH_LEVELS), "graph level names drifted from seqcls_contract"


def _param(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(_param(config, "intra_op_threads", "0"))
        opts.inter_op_num_threads = int(_param(config, "inter_op_threads", "1"))
        level = _param(config, "graph_optimization_level", "all")
        if level not in _LEVELS:
            raise pb_utils.TritonModelException(f"graph_optimization_level={level!r}; expected {sorted(_LEVELS)}")
        opts.graph_optimization_level = _LEVELS[level]
        self.batching = _param(config, "batching", "per-request")
        if self.batching not in STRATEGIES:
            raise pb_utils.TritonModelException(f"batching={self.batching!r}; expected one of {STRATEGIES}")
        self.pad_id = int(_param(config, "pad_id", "0"))
        model_file = os.path.join(version_dir, _param(config, "model_file", "model.onnx"))
        self.session = ort.InferenceSession(model_file, sess_options=opts, providers=["CPUExecutionProvider"])
        self.output = self.session.get_outputs()[0].name

    def _run(self, input_ids, type_ids):
        feeds = dict(zip(contract.MODEL_INPUTS, (input_ids, type_ids), strict=True))
        return self.session.run([self.output], feeds)[0]

    def execute(self, requests):
        feeds = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, contract.MODEL_INPUTS[0]).as_numpy()
            types = pb_utils.get_input_tensor_by_name(request, contract.MODEL_INPUTS[1]).as_numpy()
            feeds.append((ids.astype(np.int64, copy=False), types.astype(np.int64, copy=False)))
        results = [None] * len(feeds)
        if self.batching == "per-request" or len(feeds) == 1:
            groups = [[i] for i in range(len(feeds))]
        elif self.batching == "group-by-length":
            by_len = {}
            for i, (ids, _) in enumerate(feeds):
                by_len.setdefault(ids.shape[1], []).append(i)
            groups = list(by_len.values())
        else:
            groups = [list(range(len(feeds)))]
        for group in groups:
            if len(group) == 1:
                results[group[0]] = self._run(*feeds[group[0]])
                continue
            longest = max(feeds[i][0].shape[1] for i in group)
            ids = np.concatenate([_pad(feeds[i][0], longest, self.pad_id) for i in group])
            types = np.concatenate([_pad(feeds[i][1], longest, 0) for i in group])
            logits = self._run(ids, types)
            start = 0
            for i in group:
                n = feeds[i][0].shape[0]
                results[i] = logits[start : start + n]
                start += n
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(contract.LOGITS_OUTPUT, r.astype(np.float32))])
            for r in results
        ]


def _pad(x, length, value):
    if x.shape[1] == length:
        return x
    out = np.full((x.shape[0], length), value, dtype=x.dtype)
    out[:, : x.shape[1]] = x
    return out
