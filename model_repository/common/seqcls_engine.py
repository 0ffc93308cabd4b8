"""The runtime behind a profile that ONNX Runtime's CPU provider cannot run: OpenVINO at bf16.

Shipped beside ``seqcls_model``'s ``model.py`` and imported by the library too (the parity and quality
gates, ``profile: auto``, the MLflow pyfunc), so what is gated is what is served: the same ONNX file,
compiled the same way. :class:`OpenVINOSession` answers the part of ``onnxruntime.InferenceSession``
that seqcls uses (``get_inputs``, ``get_outputs``, ``get_providers``, ``run``), so callers do not branch.

Why OpenVINO: ONNX Runtime's x86 CPU provider has no bf16 kernels, while OpenVINO multiplies bf16
matrices with AVX512-BF16 / AMX instructions. The precision is asked for explicitly and read back from
the compiled model: a CPU without bf16 support would silently compute f32, so it is refused instead.

Batch-invariant batching. OpenVINO picks its bf16 kernels by input shape, so a text's logits move with
the length it is padded to (measured: up to 0.11 between "own length" and "padded to a batch's longest")
but, at a fixed shape, not with the rows beside it (bit-identical over random compositions, batch sizes
1-8 and positions, on an EPYC with AVX512-BF16). So where texts share runs, a text's answer is **the
text in its bucket shape** — its tokens padded (``pad_id``, mask 0) to the smallest of :data:`BUCKETS`
that holds it — and rows of one bucket run together, at most :data:`MAX_BATCH`, the batch padded to a
power of two: batch-mates cannot change an answer. Sharing is wanted where it pays
(:func:`batching_wanted`: AMX, or ``SEQCLS_BF16_BATCHING=on``) and allowed only after a **load-time
self-check**: every (batch, bucket) shape is run once (OpenVINO's first run of a shape is slower), then
synthetic texts of every bucket alone vs in random compositions must be bit-identical. Otherwise
batching is refused (logged, with the text that moved) and every text runs alone at its own length,
as before batching existed.
"""

import logging
import os
import random
import threading

import numpy as np

#: profile → how its graph runs: (engine, inference precision). Profiles not listed run on ONNX Runtime.
ENGINES = {"bf16": ("openvino", "bf16")}
#: CPU flags (``/proc/cpuinfo``) that give a bf16 profile hardware bf16 arithmetic; one is enough.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
#: lengths a text is padded to (capped by the graph's positions); a longer text runs alone at its own length
BUCKETS = (16, 32, 64, 128)
#: rows of one bucket run together up to this many; the batch dimension is padded to a power of two
MAX_BATCH = 8
#: where sharing runs pays (:func:`batching_wanted`), and the environment override (auto | on | off)
BATCHING_CPU_FLAGS = ("amx_bf16",)
BATCHING_ENV = "SEQCLS_BF16_BATCHING"
_IDS, _MASK = "input_ids", "attention_mask"
_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
log = logging.getLogger("seqcls_engine")
_TYPES = {"i64": "tensor(int64)", "i32": "tensor(int32)", "f32": "tensor(float)"}


class _Arg:
    """An input or output as ``onnxruntime.NodeArg`` describes it (name, type, shape). ``name`` is the ONNX
    graph's name: a port may carry several (a graph output keeps its producer's tensor name too), and the
    ONNX front end names an output's result ``<graph output>/sink_port_0``."""

    def __init__(self, port, result=None):
        self.names = frozenset(port.get_names())
        graph_name = result.get_friendly_name().rsplit("/sink_port_", 1)[0] if result is not None else None
        self.name = graph_name if graph_name in self.names else port.get_any_name()
        self.type = _TYPES.get(port.get_element_type().get_type_name(), str(port.get_element_type()))
        shape = port.get_partial_shape()
        self.shape = [d.get_length() if d.is_static else None for d in shape] if shape.rank.is_static else None


class OpenVINOSession:
    """``path`` (ONNX) compiled by OpenVINO on the CPU at ``precision`` with ``threads`` threads (0: OpenVINO's
    default), latency mode: one request at a time, as a Triton instance or a gate runs it.

    ``run`` answers every row in its bucket shape (module docstring); ``pad_id`` is the id the graph masks
    (ERNIE's graph derives its mask from it); the buckets stop at the graph's position-embedding rows
    (``max_length`` overrides it), read from the graph so that every caller (gates, pyfunc, Triton) pads
    alike. ``batch``: None decides by :func:`batching_wanted` (this CPU), True/False force it. ``batching``:
    whether rows of one bucket share an execution (wanted and the self-check passed); ``refusal`` says
    why not. Not batching, a text runs alone at its own length (no bucket padding to pay for)."""

    def __init__(self, path, precision="bf16", threads=0, *, pad_id=0, max_length=None, batch=None, warm=True):
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(path))
        # no CPU pinning: Triton's other stubs and a second instance share these cores (two single-thread
        # instances with OpenVINO's default pinning were measured at half the rate of unpinned ones)
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision, "ENABLE_CPU_PINNING": False}
        if int(threads) > 0:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        self.compiled = core.compile_model(model, "CPU", config)
        used = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        self.precision = used.get_type_name() if hasattr(used, "get_type_name") else str(used)
        if self.precision != precision:
            raise RuntimeError(
                f"OpenVINO compiled {path} at {self.precision}, not {precision}: this CPU lacks "
                f"{' / '.join(BF16_CPU_FLAGS)}"
            )
        self._inputs = [_Arg(p) for p in self.compiled.inputs]
        self._outputs = [_Arg(p, r) for p, r in zip(self.compiled.outputs, model.get_results(), strict=True)]
        self._request = self.compiled.create_infer_request()
        self._lock = threading.Lock()  # one infer request: callers on several threads take turns
        self.pad_id = int(pad_id)
        rows = embedding_rows(model)
        #: the bucket lengths of this graph (for the self-check and the gate, batching or not)
        self.bucket_set = bucket_lengths(rows.get("positions") if max_length is None else max_length)
        self.vocab = rows.get(_IDS)  # the self-check's synthetic ids stay below it
        wanted, self.refusal = batching_wanted() if batch is None else (bool(batch), None if batch else "batch=False")
        self.batching, self.self_check = False, None
        self.buckets = self.bucket_set if wanted else ()  # not batching: every text at its own length
        if warm and wanted:
            self.warm()
        if wanted:
            self.self_check = self_check(self)
            self.batching = self.self_check["passed"]
            self.refusal = None if self.batching else self.self_check["why"]
            self.buckets = self.bucket_set if self.batching else ()
        if self.refusal:
            log.warning("seqcls_engine: %s: batching refused, every text runs alone: %s", path, self.refusal)
        else:
            log.info(
                "seqcls_engine: %s: batch-invariant over %d rows in %d compositions; rows of one bucket share runs",
                path, self.self_check["rows_compared"], self.self_check["compositions"],
            )  # fmt: skip

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_providers(self):
        return [f"OpenVINO CPU ({self.precision})"]

    def bucket(self, length, buckets=None):
        """The padded length of a text of ``length`` tokens (its own beyond the largest bucket, or when
        not batching: no buckets)."""
        return next((b for b in (self.buckets if buckets is None else buckets) if b >= length), int(length))

    def lengths(self, feed):
        """Each row's own length: after its last mask 1, else after its last id that is not ``pad_id`` (the
        tokenizer pads on the right; ``[SEP]`` is never the pad)."""
        real = np.asarray(feed[_MASK]) != 0 if _MASK in feed else np.asarray(feed[_IDS]) != self.pad_id
        width = real.shape[1]
        return np.where(real.any(axis=1), width - np.argmax(real[:, ::-1], axis=1), width)

    def run(self, output_names, feed):
        """The outputs named (all when None) for ``feed`` ``{input name: [N, L] array}``, as numpy arrays: each
        row's as it is alone in its bucket shape, rows of one bucket sharing executions when :attr:`batching`."""
        names = [o.name for o in self._outputs] if output_names is None else list(output_names)
        index = [next((i for i, o in enumerate(self._outputs) if n in o.names), None) for n in names]
        missing = [n for n, i in zip(names, index, strict=True) if i is None]
        if missing:
            raise ValueError(f"no output named {missing}; the graph's outputs are {[o.name for o in self._outputs]}")
        return self.run_rows(index, feed, batching=self.batching)

    def run_rows(self, index, feed, *, batching, buckets=None):
        """:meth:`run` on output indices ``index``, with or without sharing executions, in ``buckets``
        (default: the session's) — the seam the self-check and the parity gate use."""
        buckets = self.buckets if buckets is None else tuple(buckets)
        feed = {n: np.asarray(x) for n, x in feed.items()}
        lengths = self.lengths(feed).tolist()
        groups = {}
        for row, length in enumerate(lengths):
            groups.setdefault(self.bucket(length, buckets), []).append(row)
        out = [None] * len(index)
        for width, rows in groups.items():
            bucketed = width in buckets
            size = MAX_BATCH if batching and bucketed else 1
            for start in range(0, len(rows), size):
                chunk = rows[start : start + size]
                shaped = {n: _shape(x, chunk, lengths, width, self.pad_id if n == _IDS else 0) for n, x in feed.items()}
                with self._lock:
                    result = self._request.infer(shaped)
                    parts = [np.array(result[i][: len(chunk)], copy=True) for i in index]
                for k, part in enumerate(parts):
                    if out[k] is None:
                        out[k] = np.zeros((len(lengths), *part.shape[1:]), part.dtype)
                    out[k][chunk] = part
        return [o if o is not None else self._empty(i) for o, i in zip(out, index, strict=True)]

    def _empty(self, i):
        """Output ``i`` for no rows: ``[0, ...]`` with the graph's other dimensions (0 where dynamic)."""
        shape = self._outputs[i].shape or [0, 0]
        return np.zeros((0, *[d or 0 for d in shape[1:]]), np.float32)

    def warm(self):
        """Run every (batch, bucket) shape once: OpenVINO's first run of a shape is slower."""
        for width in self.bucket_set:
            for batch in _batch_sizes():
                self._infer_synthetic(batch, width)

    def _infer_synthetic(self, batch, width):
        names = [a.name for a in self._inputs]
        feed = {n: np.full((batch, width), 1 if n in (_IDS, _MASK) else 0, _DTYPES.get(a.type, np.int64))
                for n, a in zip(names, self._inputs, strict=True)}  # fmt: skip
        with self._lock:
            self._request.infer(feed)


def _batch_sizes():
    """The batch sizes a bucket runs at: powers of two up to :data:`MAX_BATCH`."""
    sizes, b = [], 1
    while b <= MAX_BATCH:
        sizes.append(b)
        b *= 2
    return sizes


def _shape(x, rows, lengths, width, pad):
    """Rows ``rows`` of ``x`` cut to their own lengths, padded with ``pad`` to ``width`` columns, the batch
    padded to the next power of two with copies of the first row (finite, and never read back)."""
    batch = next(b for b in (*_batch_sizes(), len(rows)) if b >= len(rows))
    out = np.full((batch, width), pad, dtype=x.dtype)
    for k, row in enumerate(rows):
        n = min(lengths[row], width, x.shape[1])
        out[k, :n] = x[row, :n]
    out[len(rows) :] = out[0]
    return out


def batching_wanted(flags=None):
    """Whether texts should share runs on this host — ``(wanted, why not)`` — before the self-check asks
    whether they may. ``SEQCLS_BF16_BATCHING``: ``on``, ``off``, or ``auto`` (default): on a CPU with AMX,
    where one text's run streams all the weights (memory-bound), off elsewhere: on AVX512-BF16 without AMX
    one text is already compute-bound — 8 texts in one run measured 1.00x their rate alone, and the
    bucket padding batching needs cost 0.79x against each text at its own length."""
    mode = (os.environ.get(BATCHING_ENV) or "auto").strip().lower()
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"{BATCHING_ENV}={mode!r}; expected auto, on or off")
    if mode != "auto":
        return mode == "on", None if mode == "on" else f"{BATCHING_ENV}=off"
    if set(cpu_flags() if flags is None else flags) & set(BATCHING_CPU_FLAGS):
        return True, None
    return False, (
        f"this CPU has no {' / '.join(BATCHING_CPU_FLAGS)}: bf16 on AVX512-BF16 alone is compute-bound at one text, "
        f"so batching would not pay (each text runs at its own length; {BATCHING_ENV}=on overrides)"
    )


def embedding_rows(model):
    """Rows of the graph's embedding tables, ``{"positions": n, "input_ids": n}`` (a key missing when not
    found): 2-D constant tables read by ``Gather``; the one whose indices are not a graph input is the
    position table (ids and token types are graph inputs, ``Convert`` passed through)."""
    found, positions = {}, []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Gather":
            continue
        data, index = op.input_value(0), op.input_value(1).get_node()
        while index.get_type_name() == "Convert":
            index = index.input_value(0).get_node()
        shape = data.get_partial_shape()
        if not (data.get_node().get_type_name() == "Constant" and shape.rank.is_static and len(shape) == 2):
            continue
        if not shape[0].is_static:
            continue
        if index.get_type_name() != "Parameter":
            positions.append(shape[0].get_length())
        elif index.get_friendly_name() == _IDS:
            found[_IDS] = shape[0].get_length()
    if len(positions) == 1:
        found["positions"] = positions[0]
    return found


def bucket_lengths(max_length=None):
    """:data:`BUCKETS` below ``max_length``, which is then the last bucket (None, or beyond them all: all)."""
    if max_length is None or int(max_length) >= BUCKETS[-1]:
        return tuple(BUCKETS)
    return tuple(sorted({b for b in BUCKETS if b < int(max_length)} | {int(max_length)}))


def self_check(session, *, rows_per_bucket=MAX_BATCH + 4, compositions=3, seed=0):
    """Synthetic texts of every bucket, each alone vs in random compositions (sizes, neighbours, positions):
    ``{"passed", "rows_compared", "compositions", "rows_differing", "max_abs_diff", "why"}``. Any difference,
    or a failure, refuses batching; ids are drawn from ``[1, 100)``, below the session's ``vocab`` when smaller."""
    vocab = min(100, getattr(session, "vocab", None) or 100)
    rng = random.Random(seed)
    report = {"rows_compared": 0, "compositions": 0, "rows_differing": 0, "max_abs_diff": 0.0, "why": None}
    try:
        names = [a.name for a in session.get_inputs()]
        lower = 0
        buckets = session.bucket_set
        for width in buckets:
            texts = [
                [rng.randrange(1, vocab) for _ in range(rng.randint(lower + 1, width))] for _ in range(rows_per_bucket)
            ]
            lower = width
            feeds = [_feed([t], width, names, session.pad_id) for t in texts]
            alone = [session.run_rows([0], f, batching=False, buckets=buckets)[0][0] for f in feeds]
            for _ in range(compositions):
                members = rng.sample(range(len(texts)), rng.randint(2, min(MAX_BATCH, len(texts))))
                got = session.run_rows(
                    [0],
                    _feed([texts[i] for i in members], width, names, session.pad_id),
                    batching=True,
                    buckets=buckets,
                )[0]
                report["compositions"] += 1
                for k, i in enumerate(members):
                    diff = float(np.abs(got[k] - alone[i]).max(initial=0.0))
                    report["rows_compared"] += 1
                    report["max_abs_diff"] = max(report["max_abs_diff"], diff)
                    if not np.array_equal(got[k], alone[i]):
                        report["rows_differing"] += 1
                        report["why"] = report["why"] or (
                            f"a {len(texts[i])}-token text in bucket {width} moved by {diff:.3g} when run with "
                            f"{len(members) - 1} others (position {k}) instead of alone"
                        )
    except Exception as exc:
        report["why"] = f"the self-check failed: {type(exc).__name__}: {exc}"
    report["passed"] = report["why"] is None
    return report


def _feed(texts, width, names, pad_id):
    ids = np.full((len(texts), width), pad_id, np.int64)
    mask = np.zeros((len(texts), width), np.int64)
    for k, t in enumerate(texts):
        ids[k, : len(t)] = t
        mask[k, : len(t)] = 1
    return {n: ids if n == _IDS else mask if n == _MASK else np.zeros_like(ids) for n in names}


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The CPU's feature flags (empty when they cannot be read, e.g. not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def session(path, profile, threads=0, **options):
    """The non-ONNX-Runtime session ``profile`` runs on (:data:`ENGINES`); ``options`` as
    :class:`OpenVINOSession` takes them (``pad_id``, ``max_length``, ``batch``, ``warm``)."""
    engine, precision = ENGINES[profile]
    if engine != "openvino":
        raise ValueError(f"unknown engine {engine!r} for profile {profile!r}")
    return OpenVINOSession(path, precision, threads, **options)
