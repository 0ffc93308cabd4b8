"""The runtime behind a profile that ONNX Runtime's CPU provider cannot run: OpenVINO at bf16.

Shipped beside ``seqcls_model``'s ``model.py`` and imported by the library too (the parity and quality
gates, ``profile: auto``, the MLflow pyfunc), so what is gated is what is served: the same ONNX file,
compiled the same way. :class:`OpenVINOSession` answers the part of ``onnxruntime.InferenceSession``
that seqcls uses (``get_inputs``, ``get_outputs``, ``get_providers``, ``run``), so callers do not branch.

Why OpenVINO: ONNX Runtime's x86 CPU provider has no bf16 kernels, while OpenVINO multiplies bf16
matrices with AVX512-BF16 / AMX instructions. The precision is asked for explicitly and read back from
the compiled model: a CPU without bf16 support would silently compute f32, so it is refused instead.
"""

import threading

#: profile → how its graph runs: (engine, inference precision). Profiles not listed run on ONNX Runtime.
ENGINES = {"bf16": ("openvino", "bf16")}
#: CPU flags (``/proc/cpuinfo``) that give a bf16 profile hardware bf16 arithmetic; one is enough.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
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
    default), latency mode: one request at a time, as a Triton instance or a gate runs it."""

    def __init__(self, path, precision="bf16", threads=0):
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

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_providers(self):
        return [f"OpenVINO CPU ({self.precision})"]

    def run(self, output_names, feed):
        """The outputs named (all when None) for ``feed`` ``{input name: array}``, as numpy arrays."""
        import numpy as np

        names = [o.name for o in self._outputs] if output_names is None else list(output_names)
        index = [next((i for i, o in enumerate(self._outputs) if n in o.names), None) for n in names]
        missing = [n for n, i in zip(names, index, strict=True) if i is None]
        if missing:
            raise ValueError(f"no output named {missing}; the graph's outputs are {[o.name for o in self._outputs]}")
        with self._lock:
            result = self._request.infer(dict(feed))
            return [np.array(result[i], copy=True) for i in index]


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


def session(path, profile, threads=0):
    """The non-ONNX-Runtime session ``profile`` runs on (:data:`ENGINES`)."""
    engine, precision = ENGINES[profile]
    if engine != "openvino":
        raise ValueError(f"unknown engine {engine!r} for profile {profile!r}")
    return OpenVINOSession(path, precision, threads)
