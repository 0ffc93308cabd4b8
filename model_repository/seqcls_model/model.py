"""Triton python model ``seqcls_model`` (runtime ``python-onnxruntime``): the ONNX classifier.

Same inputs/outputs as Triton's native ``onnxruntime`` backend, for servers without it (the
local ``tritonserver`` from the nvidia-pytriton wheel, CI). ORT options come from config
parameters. ``batching`` decides how the requests of a dynamic batch run, because on CPU the
cost follows padded tokens:
- ``per-request``: one ORT run per request, no cross-request padding (CPU default);
- ``group-by-length``: requests with the same sequence length (e.g. tokenizer ``buckets``) are
  concatenated into one run;
- ``pad-to-longest``: every request padded to the batch's longest and run once (GPU style).

One bad request fails only itself, with ``INVALID_ARG``: ids outside the embedding tables
(``input_ids`` ≥ the vocabulary, ``token_type_ids`` ≥ the type vocabulary, negatives), sequences
longer than ``max_position_embeddings`` (limits read from the graph's embedding tables at load;
ORT would otherwise throw for the whole run), unequal or non-2-D shapes, or an ORT error — a
shared run that fails is retried request by request, so only the culprit gets the error. A
request of ``[0, L]`` gets ``[0, num_labels]`` logits.
"""

import json
import os
import sys

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seqcls_backend as backend
import seqcls_contract as contract

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
STRATEGIES = contract.BATCHINGS
assert set(_LEVELS) == set(contract.GRAPH_LEVELS), "graph level names drifted from seqcls_contract"
_EMBED_LAYER_NORM = ("EmbedLayerNormalization", "QEmbedLayerNormalization")  # ORT's BERT fusion (+ int8)


def embedding_limits(model_file):
    """Rows of the embedding tables the ids index: ``{input name: rows, "positions": rows}``.

    From the graph's initializers (no weights loaded): a ``Gather`` whose indices are a graph input
    is that input's table; the one other 2-D ``Gather`` table is the position embedding; a fused
    ``EmbedLayerNormalization`` names all three. Missing entries mean "not found" (never guessed).
    """
    import onnx

    graph = onnx.load(model_file, load_external_data=False).graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    inputs = set(contract.MODEL_INPUTS)
    limits, others = {}, []
    for node in graph.node:
        ins = list(node.input)
        if node.op_type == "Gather" and len(ins) == 2 and len(dims.get(ins[0], ())) == 2:
            if ins[1] in inputs:
                limits.setdefault(ins[1], dims[ins[0]][0])
            else:
                others.append(dims[ins[0]][0])
        elif node.op_type in _EMBED_LAYER_NORM and len(ins) >= 5:
            for name, table in ((ins[0], ins[2]), (ins[1], ins[4]), ("positions", ins[3])):
                if (name in inputs or name == "positions") and len(dims.get(table, ())) == 2:
                    limits.setdefault(name, dims[table][0])
    if "positions" not in limits and len(others) == 1:
        limits["positions"] = others[0]
    return limits


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(backend.param(config, "intra_op_threads", "0"))
        opts.inter_op_num_threads = int(backend.param(config, "inter_op_threads", "1"))
        level = backend.param(config, "graph_optimization_level", "all")
        if level not in _LEVELS:
            raise pb_utils.TritonModelException(f"graph_optimization_level={level!r}; expected {sorted(_LEVELS)}")
        opts.graph_optimization_level = _LEVELS[level]
        self.batching = backend.param(config, "batching", "per-request")
        if self.batching not in STRATEGIES:
            raise pb_utils.TritonModelException(f"batching={self.batching!r}; expected one of {STRATEGIES}")
        self.pad_id = int(backend.param(config, "pad_id", "0"))
        model_file = os.path.join(version_dir, backend.param(config, "model_file", "model.onnx"))
        self.session = ort.InferenceSession(model_file, sess_options=opts, providers=["CPUExecutionProvider"])
        self.output = self.session.get_outputs()[0].name
        self._limits(model_file, os.path.join(version_dir, contract.RELEASE_FILE))

    def _limits(self, model_file, release_file):
        """What a request may hold: id ranges and sequence length (graph first, then release.json)."""
        release = {}
        if os.path.isfile(release_file):
            with open(release_file, encoding="utf-8") as fh:
                release = json.load(fh)
        try:
            graph = embedding_limits(model_file)
        except Exception:  # no onnx module, an unusual graph: release.json's figures, ORT errors caught anyway
            backend.log_unexpected("seqcls_model: reading the embedding tables")
            graph = {}
        self.vocab_size = graph.get(contract.MODEL_INPUTS[0], release.get("vocab_size"))
        self.type_vocab_size = graph.get(contract.MODEL_INPUTS[1], release.get("type_vocab_size"))
        self.max_positions = graph.get("positions", release.get("max_position_embeddings", release.get("max_length")))
        dim = self.session.get_outputs()[0].shape[-1]
        self.num_labels = dim if isinstance(dim, int) else len(release.get("labels", ()))

    def _check(self, ids, types):
        """Why this request cannot run (a message), or None."""
        names = contract.MODEL_INPUTS
        if ids is None or types is None:
            return f"seqcls_model: the request needs both {names[0]} and {names[1]}"
        if ids.ndim != 2 or ids.shape != types.shape:
            return (
                f"seqcls_model: {names[0]} {list(ids.shape)} and {names[1]} {list(types.shape)}; "
                "expected two [N, L] tensors of the same shape"
            )
        if not (np.issubdtype(ids.dtype, np.integer) and np.issubdtype(types.dtype, np.integer)):
            return f"seqcls_model: ids must be integers, got {ids.dtype} and {types.dtype}"
        if ids.shape[0] and ids.shape[1] == 0:
            return "seqcls_model: sequence length 0 (a tokenized text has at least [CLS] [SEP])"
        if self.max_positions is not None and ids.shape[1] > int(self.max_positions):
            return (
                f"seqcls_model: sequence length {ids.shape[1]} is over the model's "
                f"max_position_embeddings {self.max_positions}"
            )
        for name, x, limit in ((names[0], ids, self.vocab_size), (names[1], types, self.type_vocab_size)):
            if x.size and (x.min() < 0 or (limit is not None and x.max() >= int(limit))):
                return (
                    f"seqcls_model: {name} must lie in [0, {limit if limit is not None else 'vocabulary size'}), "
                    f"got values from {x.min()} to {x.max()}"
                )
        return None

    def _feed(self, request):
        """``(input_ids, token_type_ids)`` as int64, or a message saying why the request is refused."""
        try:
            tensors = [pb_utils.get_input_tensor_by_name(request, name) for name in contract.MODEL_INPUTS]
            ids, types = (None if t is None else t.as_numpy() for t in tensors)
            problem = self._check(ids, types)
            if problem:
                return problem
            return ids.astype(np.int64, copy=False), types.astype(np.int64, copy=False)
        except Exception as exc:
            backend.log_unexpected("seqcls_model: reading a request")
            return f"seqcls_model: could not read the request ({type(exc).__name__}: {exc})"

    def _run(self, input_ids, type_ids):
        feeds = dict(zip(contract.MODEL_INPUTS, (input_ids, type_ids), strict=True))
        return self.session.run([self.output], feeds)[0]

    def _groups(self, feeds):
        """Indices of the runnable requests, grouped into ORT runs by the batching strategy."""
        runnable = [i for i, f in enumerate(feeds) if not isinstance(f, str) and f[0].shape[0]]
        if self.batching == "per-request" or len(runnable) <= 1:
            return [[i] for i in runnable]
        if self.batching == "group-by-length":
            by_len = {}
            for i in runnable:
                by_len.setdefault(feeds[i][0].shape[1], []).append(i)
            return list(by_len.values())
        return [runnable]

    def _run_one(self, feed):
        try:
            return self._run(*feed)
        except Exception as exc:
            backend.log_unexpected("seqcls_model: ONNX Runtime failed on one request")
            return f"seqcls_model: ONNX Runtime failed on this request ({type(exc).__name__}: {exc})"

    def _run_group(self, feeds, group, results):
        if len(group) == 1:
            results[group[0]] = self._run_one(feeds[group[0]])
            return
        try:
            longest = max(feeds[i][0].shape[1] for i in group)
            ids = np.concatenate([_pad(feeds[i][0], longest, self.pad_id) for i in group])
            types = np.concatenate([_pad(feeds[i][1], longest, 0) for i in group])
            logits = self._run(ids, types)
        except Exception:  # one request broke the shared run: run each alone, the culprit alone fails
            backend.log_unexpected("seqcls_model: a shared run failed; retrying request by request")
            for i in group:
                results[i] = self._run_one(feeds[i])
            return
        start = 0
        for i in group:
            n = feeds[i][0].shape[0]
            results[i] = logits[start : start + n]
            start += n

    def execute(self, requests):
        feeds = [self._feed(r) for r in requests]
        results = [f if isinstance(f, str) else np.zeros((0, self.num_labels), np.float32) for f in feeds]
        for group in self._groups(feeds):
            self._run_group(feeds, group, results)
        return [self._response(r) for r in results]

    def _response(self, result):
        if isinstance(result, str):
            return backend.invalid(result)
        try:
            logits = np.asarray(result, dtype=np.float32)
            return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(contract.LOGITS_OUTPUT, logits)])
        except Exception as exc:
            backend.log_unexpected("seqcls_model: building a response")
            return backend.invalid(f"seqcls_model: could not build the response ({type(exc).__name__}: {exc})")


def _pad(x, length, value):
    if x.shape[1] == length:
        return x
    out = np.full((x.shape[0], length), value, dtype=x.dtype)
    out[:, : x.shape[1]] = x
    return out
