"""Triton python model ``seqcls_model`` (runtime ``python-onnxruntime``): the ONNX classifier.

Same inputs/outputs as Triton's native ``onnxruntime`` backend, for servers without it (the
local ``tritonserver`` from the nvidia-pytriton wheel, CI). The inputs are exactly the ones the
graph declares, each one of ``seqcls_contract.MODEL_INPUT_NAMES`` (PaddleNLP ERNIE: ``input_ids``
+ ``token_type_ids``; HF graphs may add ``attention_mask`` or drop the token types); a request
carries all of them as ``[N, L]`` tensors of one shape. ORT options come from config parameters.
``batching`` decides how the requests of a dynamic batch run, because on CPU the cost follows
padded tokens:
- ``per-request``: one ORT run per request, no cross-request padding;
- ``group-by-length``: requests with the same sequence length (e.g. tokenizer ``buckets``) are
  concatenated into one run;
- ``pad-to-longest``: every request padded to the batch's longest and run once (GPU style);
- ``per-text`` (CPU default): every text (row) runs unpadded, at its own length — the ``attention_mask`` sum
  (up to its last 1) when the graph takes a mask, else up to its last id that is not ``pad_id``
  (the tokenizer pads on the right; ``[SEP]`` is never the pad). Rows of one length, from any
  request of the batch, share a run (no padding); the logits go back to each request in order —
  unless the graph quantises dynamically (``int8``: activation ranges computed per run, so
  neighbours move a row's logits): then every row runs alone, as the parity gate validated it.

The inputs are declared ``allow_ragged_batch``: a dynamic batch may hold requests of any lengths,
since every strategy above takes each request at its own shape. Without it Triton merges only
equal shapes (single texts of different lengths never), and on 2 cores its batcher thread was
measured spinning a third of a core while the one instance was busy, at 3-4 clients.

A version whose ``release.json`` names a profile of ``seqcls_engine.ENGINES`` (``bf16``) runs the same graph
on that engine (OpenVINO at bf16). Where the engine batches (a CPU with AMX, or ``SEQCLS_BF16_BATCHING=on``,
and its load-time self-check proved rows of a length bucket bit-identical to alone), ``per-text`` groups
rows by bucket and each group is one call (the engine pads each text to its bucket); otherwise every text
runs alone at its own length. The log says which, and why. On a CPU without bf16 arithmetic the load
fails rather than serve f32 quietly.

One bad request fails only itself, with ``INVALID_ARG``: ids outside the embedding tables
(``input_ids`` ≥ the vocabulary, ``token_type_ids`` ≥ the type vocabulary, negatives), an
``attention_mask`` other than 0/1, sequences longer than ``max_position_embeddings`` (limits read
from the graph's embedding tables at load; ORT would otherwise throw for the whole run), a
missing input, unequal or non-2-D shapes, or an ORT error — a shared run that fails is retried
request by request (row by row under ``per-text``), so only the culprit gets the error. A request
of ``[0, L]`` gets ``[0, num_labels]`` logits.
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
import seqcls_engine as engine

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
STRATEGIES = contract.BATCHINGS
assert set(_LEVELS) == set(contract.GRAPH_LEVELS), "graph level names drifted from seqcls_contract"
assert "per-text" in STRATEGIES, "per-text batching missing from seqcls_contract.BATCHINGS"
_EMBED_LAYER_NORM = ("EmbedLayerNormalization", "QEmbedLayerNormalization")  # ORT's BERT fusion (+ int8)
_PASS_THROUGH = ("Cast", "Identity")  # index tensors torch.onnx may route an input through
#: ops that compute a quantisation range at run time over the whole input: rows sharing a run move each other
_RUN_TIME_RANGES = ("DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM")
_IDS, _TYPES, _MASK = contract.MODEL_INPUT_NAMES
_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def batch_dependent(graph):
    """Whether a row's logits depend on the rows run with it (dynamic quantisation: ``int8``)."""
    return any(node.op_type in _RUN_TIME_RANGES for node in graph.node)


def embedding_limits(model_file):
    """Rows of the embedding tables the ids index: ``{input name: rows, "positions": rows}``.

    From the graph's initializers (no weights loaded): a ``Gather`` whose indices are a graph input
    (directly or through ``Cast``/``Identity``, as torch.onnx exports write it) is that input's
    table; the one other 2-D ``Gather`` table is the position embedding; a fused
    ``EmbedLayerNormalization`` names all three. ``attention_mask`` indexes no table. Missing
    entries mean "not found" (never guessed): e.g. two other tables (a buffered token-type index,
    relative positions) leave ``positions`` out.
    """
    import onnx

    graph = onnx.load(model_file, load_external_data=False).graph if isinstance(model_file, str) else model_file
    dims = {t.name: list(t.dims) for t in graph.initializer}
    inputs = {i.name for i in graph.input} & set(contract.MODEL_INPUT_NAMES)
    producer = {out: node for node in graph.node for out in node.output}

    def source(name):
        """The graph input ``name`` is computed from by pass-through nodes only, else ``name``."""
        seen = set()
        while name not in inputs and name in producer and name not in seen:
            seen.add(name)
            node = producer[name]
            if node.op_type not in _PASS_THROUGH or len(node.input) != 1:
                break
            name = node.input[0]
        return name

    def table(name):
        return len(dims.get(name, ())) == 2

    limits, others = {}, []
    for node in graph.node:
        ins = list(node.input)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if node.op_type == "Gather" and len(ins) == 2 and axis == 0 and table(ins[0]):
            index = source(ins[1])
            if index in inputs:
                if index != _MASK:
                    limits.setdefault(index, dims[ins[0]][0])
            else:
                others.append(dims[ins[0]][0])
        elif node.op_type in _EMBED_LAYER_NORM and len(ins) >= 5:
            for name, tbl in ((source(ins[0]), ins[2]), (source(ins[1]), ins[4]), ("positions", ins[3])):
                if name in (_IDS, _TYPES, "positions") and (name == "positions" or name in inputs) and table(tbl):
                    limits.setdefault(name, dims[tbl][0])
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
        #: per-text only: rows of one length share an ORT run (False: strictly one run per row; set from the graph)
        self.group_equal_lengths = True
        self.pad_id = int(backend.param(config, "pad_id", "0"))
        model_file = os.path.join(version_dir, backend.param(config, "model_file", "model.onnx"))
        release_file = os.path.join(version_dir, contract.RELEASE_FILE)
        self.profile = _release(release_file).get("profile")
        if self.profile in engine.ENGINES:  # bf16: the graph on OpenVINO, compiled as the gates ran it
            self.session = engine.session(model_file, self.profile, opts.intra_op_num_threads, pad_id=self.pad_id)
            log_info = getattr(getattr(pb_utils, "Logger", None), "log_info", None)
            if log_info is not None:  # Triton's log says whether texts share runs, and why not
                batching = self.session.batching
                log_info(f"seqcls_model: {self.profile} batching {'on' if batching else 'off'}: "
                         f"{self.session.self_check if batching else self.session.refusal}")  # fmt: skip
        else:
            self.session = ort.InferenceSession(model_file, sess_options=opts, providers=["CPUExecutionProvider"])
        self._inputs(self.session.get_inputs())
        self.output = self.session.get_outputs()[0].name
        self._limits(model_file, release_file)

    def _inputs(self, declared):
        """The graph's inputs, in contract order, with the integer type each one takes."""
        types = {i.name: i.type for i in declared}
        for name in types:
            if name not in contract.MODEL_INPUT_NAMES:
                raise pb_utils.TritonModelException(
                    f"seqcls_model: the graph takes input {name!r}, which is not one of "
                    f"{contract.MODEL_INPUT_NAMES} (seqcls_contract.MODEL_INPUT_NAMES)"
                )
            if types[name] not in _DTYPES:
                raise pb_utils.TritonModelException(
                    f"seqcls_model: the graph's input {name!r} is {types[name]}; expected int64 or int32"
                )
        if _IDS not in types:
            raise pb_utils.TritonModelException(f"seqcls_model: the graph takes no {_IDS!r} (inputs {sorted(types)})")
        self.inputs = tuple(n for n in contract.MODEL_INPUT_NAMES if n in types)
        self.dtypes = {n: _DTYPES[types[n]] for n in self.inputs}
        self.pads = {n: self.pad_id if n == _IDS else 0 for n in self.inputs}

    def _limits(self, model_file, release_file):
        """What a request may hold: id ranges and sequence length (graph first, then release.json)."""
        release = _release(release_file)
        try:
            import onnx

            loaded = onnx.load(model_file, load_external_data=False).graph
            graph = embedding_limits(loaded)
            # a validated answer is each text alone: where neighbours move logits, rows never share a run
            # (dynamic int8; an engine whose load-time self-check did not prove rows of a bucket batch-invariant)
            self.group_equal_lengths = not batch_dependent(loaded) and (
                self.profile not in engine.ENGINES or bool(getattr(self.session, "batching", False))
            )
        except Exception:  # no onnx module, an unusual graph: release.json's figures, ORT errors caught anyway
            backend.log_unexpected("seqcls_model: reading the embedding tables")
            graph, self.group_equal_lengths = {}, False  # unknown graph: the exact way
        self.vocab_size = graph.get(_IDS, release.get("vocab_size"))
        self.type_vocab_size = graph.get(_TYPES, release.get("type_vocab_size"))
        self.max_positions = graph.get("positions", release.get("max_position_embeddings", release.get("max_length")))
        self.value_limits = {_IDS: self.vocab_size, _TYPES: self.type_vocab_size, _MASK: 2}
        dim = self.session.get_outputs()[0].shape[-1]
        self.num_labels = dim if isinstance(dim, int) else len(release.get("labels", ()))

    def _check(self, arrays):
        """Why this request (``{input name: array or None}``) cannot run (a message), or None."""
        missing = [n for n in self.inputs if arrays.get(n) is None]
        if missing:
            names = list(self.inputs)
            need = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            return f"seqcls_model: the request needs {'both ' if len(names) == 2 else ''}{need} (missing {missing})"
        xs = [arrays[n] for n in self.inputs]
        first = xs[0]
        if first.ndim != 2 or any(x.shape != first.shape for x in xs):
            shapes = ", ".join(f"{n} {list(x.shape)}" for n, x in zip(self.inputs, xs, strict=True))
            return f"seqcls_model: {shapes}; expected [N, L] tensors of the same shape"
        if not all(np.issubdtype(x.dtype, np.integer) for x in xs):
            return f"seqcls_model: ids must be integers, got {', '.join(str(x.dtype) for x in xs)}"
        if first.shape[0] and first.shape[1] == 0:
            return "seqcls_model: sequence length 0 (a tokenized text has at least [CLS] [SEP])"
        if self.max_positions is not None and first.shape[1] > int(self.max_positions):
            return (
                f"seqcls_model: sequence length {first.shape[1]} is over the model's "
                f"max_position_embeddings {self.max_positions}"
            )
        for name, x in zip(self.inputs, xs, strict=True):
            limit = self.value_limits.get(name)
            if x.size and (x.min() < 0 or (limit is not None and x.max() >= int(limit))):
                if name == _MASK:
                    return f"seqcls_model: {name} must be 0 or 1, got values from {x.min()} to {x.max()}"
                return (
                    f"seqcls_model: {name} must lie in [0, {limit if limit is not None else 'vocabulary size'}), "
                    f"got values from {x.min()} to {x.max()}"
                )
        return None

    def _feed(self, request):
        """``{input name: array}`` in the graph's types, or a message saying why the request is refused."""
        try:
            arrays = {}
            for name in self.inputs:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                arrays[name] = None if tensor is None else tensor.as_numpy()
            problem = self._check(arrays)
            if problem:
                return problem
            return {n: arrays[n].astype(self.dtypes[n], copy=False) for n in self.inputs}
        except Exception as exc:
            backend.log_unexpected("seqcls_model: reading a request")
            return f"seqcls_model: could not read the request ({type(exc).__name__}: {exc})"

    def _run(self, feed):
        return self.session.run([self.output], feed)[0]

    def _groups(self, feeds):
        """Indices of the runnable requests, grouped into ORT runs by the batching strategy."""
        runnable = [i for i, f in enumerate(feeds) if not isinstance(f, str) and f[_IDS].shape[0]]
        if self.batching == "per-request" or len(runnable) <= 1:
            return [[i] for i in runnable]
        if self.batching == "group-by-length":
            by_len = {}
            for i in runnable:
                by_len.setdefault(feeds[i][_IDS].shape[1], []).append(i)
            return list(by_len.values())
        return [runnable]

    def _run_one(self, feed, what="request"):
        try:
            return self._run(feed)
        except Exception as exc:
            backend.log_unexpected(f"seqcls_model: ONNX Runtime failed on one {what}")
            return f"seqcls_model: ONNX Runtime failed on this {what} ({type(exc).__name__}: {exc})"

    def _run_group(self, feeds, group, results):
        if len(group) == 1:
            results[group[0]] = self._run_one(feeds[group[0]])
            return
        try:
            longest = max(feeds[i][_IDS].shape[1] for i in group)
            feed = {n: np.concatenate([_pad(feeds[i][n], longest, self.pads[n]) for i in group]) for n in self.inputs}
            logits = self._run(feed)
        except Exception:  # one request broke the shared run: run each alone, the culprit alone fails
            backend.log_unexpected("seqcls_model: a shared run failed; retrying request by request")
            for i in group:
                results[i] = self._run_one(feeds[i])
            return
        start = 0
        for i in group:
            n = feeds[i][_IDS].shape[0]
            results[i] = logits[start : start + n]
            start += n

    def _lengths(self, feed):
        """Each row's unpadded length: after its last mask 1, else after its last non-pad id."""
        real = feed[_MASK] != 0 if _MASK in self.inputs else feed[_IDS] != self.pad_id
        width = real.shape[1]
        lengths = width - np.argmax(real[:, ::-1], axis=1)
        return np.where(real.any(axis=1), lengths, width)  # nothing real: run the row as given

    def _run_texts(self, feeds, results):
        """``per-text``: every row at its own length; rows of one length share a run."""
        rows, parts = {}, {}  # length (an engine's bucket) → [(request, row)]; request → its rows' logits
        width = getattr(self.session, "bucket", None) if self.profile in engine.ENGINES else None
        for i, feed in enumerate(feeds):
            if isinstance(feed, str) or not feed[_IDS].shape[0]:
                continue
            parts[i] = [None] * feed[_IDS].shape[0]
            for r, length in enumerate(self._lengths(feed).tolist()):
                rows.setdefault(width(length) if width else length, []).append((i, r))
        runs = rows.items() if self.group_equal_lengths else ((k, [x]) for k, xs in rows.items() for x in xs)
        for length, members in runs:
            members = [m for m in members if m[0] in parts]  # not the rows of a request already failed
            if not members:
                continue
            feed = {
                n: np.concatenate([_pad(feeds[i][n][r : r + 1, :length], length, self.pads[n]) for i, r in members])
                for n in self.inputs
            }
            try:
                logits = self._run(feed) if len(members) > 1 else None
            except Exception:  # one row broke the shared run: run each alone, the culprit's request fails
                backend.log_unexpected("seqcls_model: a shared run failed; retrying text by text")
                logits = None
            for k, (i, r) in enumerate(members):
                if i not in parts:
                    continue  # an earlier row of this request failed it in this run
                out = (
                    logits[k]
                    if logits is not None
                    else self._run_one({n: x[k : k + 1] for n, x in feed.items()}, "text")
                )
                if isinstance(out, str):
                    results[i] = out
                    del parts[i]
                else:
                    parts[i][r] = out.reshape(-1)
        for i, logits in parts.items():
            results[i] = np.stack(logits)

    def execute(self, requests):
        feeds = [self._feed(r) for r in requests]
        results = [f if isinstance(f, str) else np.zeros((0, self.num_labels), np.float32) for f in feeds]
        if self.batching == "per-text":
            self._run_texts(feeds, results)
        else:
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


def _release(path):
    """The version's ``release.json`` (empty when absent: a version published without one)."""
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _pad(x, length, value):
    if x.shape[1] == length:
        return x
    out = np.full((x.shape[0], length), value, dtype=x.dtype)
    out[:, : x.shape[1]] = x
    return out
