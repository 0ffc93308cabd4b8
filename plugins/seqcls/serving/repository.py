"""The Triton model repository: render configs from the release, validate them, read live state.

The live repository (``Settings.triton_repository``) is never the git tree: ``model_repository/``
holds templates (``config.pbtxt.tmpl``), the python models and the shared modules, and this
module renders them. Triton's ``config.pbtxt`` is shared by every version of a model, while a
zero-downtime reload needs version N-1 and N loaded side by side — so per-release values
(labels, thresholds, max_length, vocabulary) live in each version's immutable ``release.json``
and files, and ``config.pbtxt`` only carries serving settings plus the ``version_policy`` that
says which versions are live. Each version keeps a snapshot of the config it was rendered with
(``config.snapshot.pbtxt``), so a rollback restores it exactly.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from string import Template
from typing import Any

from seqcls.checkpoints.checkpoint import sha256_file
from seqcls.contract import shipped
from seqcls.contract.names import CLASSIC, ModelName, ServingNames, require_name
from seqcls.errors import InputError, ServingError
from seqcls.files import atomic_write, held, replace_dir
from seqcls.serving.pins import read_pin
from seqcls.settings import DEVICES, PIPELINES, RUNTIMES, Settings, parse_layout
from seqcls.spec import ServingSpec, combination_refusal

log = logging.getLogger(__name__)

SNAPSHOT = "config.snapshot.pbtxt"
LOCK_FILE = ".seqcls-publish.{model}.lock"
#: Triton versions of a model a publish keeps (older ones are pruned): the rollback depth gc keeps whole too.
DEFAULT_RETAIN = 3

# The serving contract's enums, defined once in model_repository/common/seqcls_contract.py.
_contract = shipped.contract()
PADDINGS: tuple[str, ...] = _contract.PADDINGS
BATCHINGS: tuple[str, ...] = _contract.BATCHINGS
GRAPH_LEVELS: dict[str, int] = _contract.GRAPH_LEVELS
DEFAULT_BUCKETS: tuple[int, ...] = _contract.DEFAULT_BUCKETS
RELEASE_FILE: str = _contract.RELEASE_FILE
MAX_TEXT_BYTES: int = _contract.MAX_TEXT_BYTES
ACCELERATORS = ("none", "tensorrt", "tensorrt-fp16")
#: ``model_repository/`` directory of the direct pipeline's public model (its template and model.py).
DIRECT_SOURCE = "seqcls_direct"
#: The direct model's file naming each step's rendered config (``{step: ModelConfig as JSON}``).
DIRECT_STEPS_FILE = "steps.json"
TOKENIZER_IMPLS = ("hf", "paddlenlp")


@dataclass(frozen=True)
class ServingOptions:
    """How the ensemble is served (same for every release rendered with these options).

    Defaults are the CPU serving stack measured on 2 cores: no padding at all (the cost follows
    padded tokens on CPU: ``per-text`` runs every text at its own length, equal lengths of a dynamic
    batch in one run — an 8-text request 1.27-1.47x faster than ``per-request``, logits identical),
    one model instance using both cores, its inputs ragged so the dynamic batcher merges texts of
    any lengths (equal shapes only otherwise: a single-text batch stayed 1.01 and the batcher spun,
    0.67x classic at 4 clients). :meth:`for_device`
    gives the GPU variant: native ONNX Runtime backend, GPU instance, length buckets so Triton's
    dynamic batcher can merge requests of similar length, TensorRT FP16 optional.
    """

    runtime: str = "python-onnxruntime"
    device: str = "cpu"
    max_batch_size: int = 64
    dynamic_batching: bool = True
    max_queue_delay_us: int = 0  # CPU: requests merge while the one instance is busy; a delay only adds latency
    padding: str = "longest"
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    batching: str = "per-text"
    tokenizer_instances: int = 1
    model_instances: int = 1
    intra_op_threads: int = 2
    inter_op_threads: int = 1
    graph_optimization_level: str = "all"
    gpu_accelerator: str = "none"
    keep_previous_loaded: bool = True
    tokenizer_impl: str = "hf"  # "hf": seqcls_text (fast); "paddlenlp": the classic per-request tokenizer
    max_text_bytes: int = MAX_TEXT_BYTES  # a longer text is refused (INVALID_ARGUMENT), never truncated
    metrics: bool = True  # the python models export seqcls_* metrics (off: only to measure their cost)
    #: "ensemble": <m> is Triton's ensemble of the three models; "direct": one python model runs the same
    #: three steps in one stub (a lone request pays one stub hop instead of three; python runtime only)
    pipeline: str = "ensemble"

    def __post_init__(self) -> None:
        checks = {
            "runtime": (self.runtime, RUNTIMES),
            "device": (self.device, DEVICES),
            "padding": (self.padding, PADDINGS),
            "batching": (self.batching, BATCHINGS),
            "graph_optimization_level": (self.graph_optimization_level, tuple(GRAPH_LEVELS)),
            "gpu_accelerator": (self.gpu_accelerator, ACCELERATORS),
            "tokenizer_impl": (self.tokenizer_impl, TOKENIZER_IMPLS),
            "pipeline": (self.pipeline, PIPELINES),
        }
        for name, (value, allowed) in checks.items():
            if value not in allowed:
                raise InputError(f"serving option {name}={value!r}; expected one of {', '.join(allowed)}")
        refusal = combination_refusal(self.runtime, self.device, self.pipeline)
        if refusal:
            raise InputError(refusal)
        for name in ("max_batch_size", "tokenizer_instances", "model_instances", "max_text_bytes"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"serving option {name} must be >= 1")

    @classmethod
    def for_device(cls, device: str, runtime: str | None = None, **overrides: Any) -> ServingOptions:
        if device == "gpu":
            base = cls(
                runtime="onnxruntime",
                device="gpu",
                padding="buckets",
                batching="pad-to-longest",
                max_queue_delay_us=2000,
                intra_op_threads=0,
                gpu_accelerator="none",
            )
        else:
            base = cls(runtime=runtime or "python-onnxruntime", device="cpu")
        return replace(base, **overrides)

    @classmethod
    def from_spec(cls, spec: ServingSpec, **overrides: Any) -> ServingOptions:
        """The device's options with the release's serving spec applied (runtime, pipeline, layout, metrics)."""
        if spec.layout and spec.device == "cpu":
            instances, threads = parse_layout(spec.layout, source="layout")
            overrides = {"model_instances": instances, "intra_op_threads": threads, **overrides}
        if not spec.metrics:
            overrides = {"metrics": False, **overrides}
        if spec.pipeline != "ensemble":
            overrides = {"pipeline": spec.pipeline, **overrides}
        return cls.for_device(spec.device, spec.runtime, **overrides)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["buckets"] = list(self.buckets)
        return d


def version_policy(versions: Sequence[int]) -> str:
    vs = ", ".join(str(v) for v in sorted(set(versions)))
    return f"version_policy: {{ specific: {{ versions: [ {vs} ] }} }}"


def source_dir(model: str, options: ServingOptions, names: ServingNames = CLASSIC) -> str:
    """The ``model_repository/`` directory holding ``model``'s template (and python code) under ``options``."""
    if options.pipeline == "direct" and names.role(model) in ("ensemble", "candidate"):
        return DIRECT_SOURCE
    return names.source(model)


def _template(source: Path, model: str, options: ServingOptions, names: ServingNames) -> Template:
    role = names.role(model)
    name = f"config.{options.runtime}.pbtxt.tmpl" if role == "model" else "config.pbtxt.tmpl"
    path = source / source_dir(model, options, names) / name
    if not path.is_file():
        raise InputError(f"{path}: config template missing from the serving source")
    return Template(path.read_text(encoding="utf-8"))


def render_config(
    source: Path,
    model: str,
    options: ServingOptions,
    *,
    version: int,
    num_labels: int,
    pad_id: int = 0,
    versions: Sequence[int] | None = None,
    names: ServingNames = CLASSIC,
    model_inputs: Sequence[str] = _contract.MODEL_INPUTS,
) -> str:
    """The ``config.pbtxt`` text of Triton model ``model`` (one of ``names``) for release ``version``
    (live versions ``versions``); ``model_inputs``: the id tensors the graph takes, which the
    tokenizer outputs and the ensemble wires (the Paddle pair unless the release says otherwise)."""
    unknown = [n for n in model_inputs if n not in _contract.MODEL_INPUT_NAMES]
    if unknown or not model_inputs:
        raise InputError(f"model inputs {list(model_inputs)}: expected a subset of {_contract.MODEL_INPUT_NAMES}")
    kind = "KIND_GPU" if options.device == "gpu" else "KIND_CPU"
    accel = ""
    if options.gpu_accelerator.startswith("tensorrt"):
        precision = "FP16" if options.gpu_accelerator.endswith("fp16") else "FP32"
        accel = (
            'execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" '
            f'parameters {{ key: "precision_mode" value: "{precision}" }} '
            'parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] }'
        )
    dyn = ""
    if options.dynamic_batching:
        dyn = f"dynamic_batching {{ max_queue_delay_microseconds: {int(options.max_queue_delay_us)} }}"
    values = {
        "name": model,
        "tokenizer_name": names.tokenizer,
        "model_name": names.model,
        "postprocess_name": names.postprocess,
        "max_batch_size": int(options.max_batch_size),
        "version_policy": version_policy(versions or [version]),
        "version": int(version),
        "dynamic_batching": dyn,
        "tokenizer_instances": int(options.tokenizer_instances),
        "model_instances": int(options.model_instances),
        "padding": options.padding,
        "metrics": "on" if options.metrics else "off",
        "buckets": ",".join(str(b) for b in options.buckets),
        "intra_op_threads": int(options.intra_op_threads),
        "inter_op_threads": int(options.inter_op_threads),
        "graph_optimization_level": options.graph_optimization_level,
        "ort_graph_level": GRAPH_LEVELS[options.graph_optimization_level],
        "batching": options.batching,
        "pad_id": int(pad_id),
        "num_labels": int(num_labels),
        "instance_kind": kind,
        "model_inputs": ",\n".join(f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}' for n in model_inputs),
        # the python model takes each request at its own shape, so its dynamic batcher may merge any
        # lengths (Triton merges only equal shapes otherwise, and spins waiting for the busy instance)
        "ragged_model_inputs": ",\n".join(
            f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }}' for n in model_inputs
        ),
        "tokenizer_output_map": "\n".join(f'      output_map {{ key: "{n}" value: "_{n}" }}' for n in model_inputs),
        "model_input_map": "\n".join(f'      input_map {{ key: "{n}" value: "_{n}" }}' for n in model_inputs),
        "execution_accelerators": accel,
    }
    try:
        return _template(source, model, options, names).substitute(values)
    except (KeyError, ValueError) as exc:
        raise InputError(f"template of {model} references an unknown placeholder: {exc}") from exc


def parse_config(text: str, where: str = "config.pbtxt"):
    """Parse with Triton's own ``ModelConfig`` protobuf: what a server would reject fails here."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ServingError(f"{where}: not a valid Triton model config: {exc}") from exc
    return config


def _io(items) -> list[tuple[str, int, tuple[int, ...]]]:
    return sorted((t.name, int(t.data_type), tuple(t.dims)) for t in items)


def check_configs(
    configs: dict[str, str], version: int, names: ServingNames = CLASSIC, pipeline: str = "ensemble"
) -> None:
    """Parse every config and check the public model's wiring against the composing models' I/O: the
    ensemble's steps, or (``direct``) a python model taking the tokenizer's inputs and giving the
    postprocess's outputs."""
    ensemble = names.ensemble
    parsed = {name: parse_config(text, f"{name}/config.pbtxt") for name, text in configs.items()}
    for name, cfg in parsed.items():
        if cfg.name != name:
            raise ServingError(f"{name}/config.pbtxt: name is {cfg.name!r}, expected {name!r}")
    ens = parsed[ensemble]
    for step in names.composing:
        if parsed[step].max_batch_size < ens.max_batch_size:
            raise ServingError(
                f"{step}: max_batch_size {parsed[step].max_batch_size} < ensemble's {ens.max_batch_size}"
            )
    if pipeline == "direct":
        if ens.backend != "python" or ens.platform:
            kind = ens.platform or ens.backend
            raise ServingError(f"{ensemble}: the direct pipeline is a python model, not {kind!r}")
        io = {
            "inputs": (ens.input, parsed[names.tokenizer].input),
            "outputs": (ens.output, parsed[names.postprocess].output),
        }
        for what, (mine, theirs) in io.items():
            if _io(mine) != _io(theirs):
                raise ServingError(f"{ensemble}: {what} {_io(mine)} differ from its steps' {_io(theirs)}")
        return
    steps = list(ens.ensemble_scheduling.step)
    if [s.model_name for s in steps] != list(names.composing):
        raise ServingError(f"{ensemble}: steps {[s.model_name for s in steps]}, expected {list(names.composing)}")
    for step in steps:
        if step.model_version != version:
            raise ServingError(f"{ensemble}: step {step.model_name} pins version {step.model_version}, not {version}")
        cfg = parsed[step.model_name]
        inputs = {i.name for i in cfg.input}
        outputs = {o.name for o in cfg.output}
        if set(step.input_map) != inputs:
            raise ServingError(
                f"{ensemble}: step {step.model_name} maps inputs {sorted(step.input_map)}, model has {sorted(inputs)}"
            )
        if not set(step.output_map) <= outputs:
            raise ServingError(
                f"{ensemble}: step {step.model_name} maps outputs {sorted(step.output_map)}, "
                f"model has {sorted(outputs)}"
            )


def direct_steps(configs: dict[str, str], names: ServingNames) -> dict[str, Any]:
    """The direct model's :data:`DIRECT_STEPS_FILE`: each step's rendered config as Triton's JSON form (what a
    python model's ``args["model_config"]`` holds), by step directory (``tokenizer``, ``model``, ``postprocess``)."""
    from google.protobuf import json_format

    return {
        role: json_format.MessageToDict(
            parse_config(configs[getattr(names, role)], f"{getattr(names, role)}/config.pbtxt"),
            preserving_proto_field_name=True,
        )
        for role in DIRECT_STEPS
    }


#: The direct model's step directories, in order: each holds that composing model's version files.
DIRECT_STEPS = ("tokenizer", "model", "postprocess")


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


_POLICY_RE = re.compile(r"version_policy:\s*\{\s*specific:\s*\{\s*versions:\s*\[([^\]]*)\]")


@dataclass
class Repository:
    """A live Triton model repository directory."""

    root: Path
    source: Path
    names: ServingNames = CLASSIC
    _versions_cache: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings, model: ModelName) -> Repository:
        """The repository as seen by model ``model_name`` (its Triton names: :mod:`seqcls.contract.names`)."""
        assert settings.triton_repository is not None and settings.model_repository_source is not None
        return cls(Path(settings.triton_repository), Path(settings.model_repository_source), require_name(model).names)

    def for_model(self, model: ModelName) -> Repository:
        return Repository(self.root, self.source, require_name(model).names)

    @property
    def model_name(self) -> ModelName:
        return self.names.model_name

    def lock(self, *, timeout: float = 600.0, what: str = "publish/reconcile"):
        """One writer of this model's live configs at a time (across processes and hosts sharing the
        volume, as far as the filesystem honours ``flock``); other models have their own lock, so
        their releases proceed side by side. Waits at most ``timeout``, then names the holder."""
        return held(self.root / LOCK_FILE.format(model=self.model_name), timeout=timeout, what=what)

    def versions(self, model: str | None = None) -> list[int]:
        d = self.root / (model or self.names.ensemble)
        if not d.is_dir():
            return []
        return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())

    def complete_versions(self) -> list[int]:
        """Versions present for all four models (a release is only usable whole)."""
        sets = [set(self.versions(m)) for m in self.names.models]
        return sorted(set.intersection(*sets)) if sets else []

    def release_info(self, version: int) -> dict[str, Any] | None:
        p = self.root / self.names.ensemble / str(version) / RELEASE_FILE
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None

    def direct_versions(self, versions: Sequence[int | None]) -> set[int]:
        """Those of ``versions`` published with the direct pipeline (``release.json``'s serving options); a
        version whose record cannot be read counts as an ensemble (its composing models load: the safe side)."""
        out = set()
        for version in {v for v in versions if v is not None}:
            try:
                info = self.release_info(version) or {}
            except (OSError, ValueError):
                continue
            if isinstance(info.get("serving"), dict) and info["serving"].get("pipeline") == "direct":
                out.add(version)
        return out

    def recorded(self, version: int, model: str) -> dict[str, Any] | None:
        """What ``model``'s ``version`` was published as: its pinned ``release.json`` (kept outside the
        version directory, :mod:`seqcls.serving.pins`), else its own (a version published before pins);
        None when neither reads."""
        pin = read_pin(self.root, self.model_name, version)
        if pin is not None and model in pin.models:
            return pin.models[model].info
        try:
            info = json.loads((self.root / model / str(version) / RELEASE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def damaged_files(self, version: int) -> list[str]:
        """Files of ``version`` missing or changed since publish: against its pin (its ``release.json`` included),
        else — a version published before pins — the hashes of its own ``release.json``."""
        problems = []
        keys = set()
        pin = read_pin(self.root, self.model_name, version)
        for model in self.names.models:
            vdir = self.root / model / str(version)
            info_path = vdir / RELEASE_FILE
            pinned = pin.models.get(model) if pin is not None else None
            if pinned is not None:
                if not info_path.is_file():
                    problems.append(f"{model}/{version}/{RELEASE_FILE} missing")
                elif info_path.read_bytes() != pinned.release_json:
                    problems.append(f"{model}/{version}/{RELEASE_FILE} changed since publish")
                info = pinned.info
            elif not info_path.is_file():
                problems.append(f"{model}/{version}/{RELEASE_FILE} missing")
                continue
            else:
                try:
                    info = json.loads(info_path.read_text(encoding="utf-8"))
                except ValueError:
                    problems.append(f"{model}/{version}/{RELEASE_FILE} is not JSON")
                    continue
            keys.add(info.get("publish_key"))
            if info.get("version") != version or info.get("model") != model or not info.get("files"):
                problems.append(f"{model}/{version}/{RELEASE_FILE} does not describe {model} version {version}")
            for rel, digest in info.get("files", {}).items():
                p = vdir / rel
                if not p.is_file():
                    problems.append(f"{model}/{version}/{rel} missing")
                elif sha256_file(p) != digest:
                    problems.append(f"{model}/{version}/{rel} changed since publish")
        if len(keys) > 1:
            problems.append(f"the four models of version {version} come from different releases")
        return problems

    def problems(self, version: int) -> list[str]:
        """Why ``version`` cannot be served as published (empty = complete and intact): missing for some
        model, or files missing/changed since publish. Hashes every file, so call it before recording."""
        present = [m for m in self.names.models if version in self.versions(m)]
        if len(present) < len(self.names.models):
            where = f"only {', '.join(present)} have it" if present else "no directory of it is left"
            return [f"version {version} is missing from {self.root} ({where}; pruned or deleted)"]
        return self.damaged_files(version)

    def config_text(self, model: str) -> str | None:
        p = self.root / model / "config.pbtxt"
        return p.read_text(encoding="utf-8") if p.is_file() else None

    def live_versions(self, model: str) -> list[int]:
        """Versions the on-disk ``config.pbtxt`` says are live (empty when not configured)."""
        text = self.config_text(model)
        if not text:
            return []
        m = _POLICY_RE.search(text)
        return sorted(int(v) for v in m.group(1).replace(",", " ").split()) if m else []

    def serving_version(self) -> int | None:
        live = self.live_versions(self.names.ensemble)
        return live[-1] if live else None

    def snapshot(self, model: str, version: int) -> str:
        p = self.root / model / str(version) / SNAPSHOT
        if not p.is_file():
            raise ServingError(f"{p}: version {version} of {model} has no config snapshot; republish it")
        return p.read_text(encoding="utf-8")

    def write_config(self, model: str, text: str) -> None:
        """Atomically replace ``<model>/config.pbtxt`` (Triton reads it only when told to load)."""
        atomic_write(self.root / model / "config.pbtxt", text)

    def restore_config(self, model: str, text: str | None) -> None:
        target = self.root / model / "config.pbtxt"
        if text is None:
            target.unlink(missing_ok=True)
        else:
            self.write_config(model, text)

    def config_for(self, model: str, version: int, live: Sequence[int]) -> str:
        """Version ``version``'s snapshot with the version policy set to ``live``."""
        text = self.snapshot(model, version)
        return _POLICY_RE.sub(lambda m: version_policy(live)[: -len(" } }")], text, count=1)

    def candidate_config(self, version: int) -> str:
        """The candidate route's config: ensemble ``version``'s snapshot under its own name, pinned."""
        text = self.config_for(self.names.ensemble, version, [version])
        return re.sub(r'^name:\s*"[^"]*"', f'name: "{self.names.candidate}"', text, count=1, flags=re.M)

    def ensure_candidate_version(self, version: int) -> None:
        """``<candidate>/<version>/`` (an ensemble version directory holds only metadata)."""
        target = self.root / self.names.candidate / str(version)
        if target.is_dir():
            return
        tmp = self.root / self.names.candidate / f".tmp-{os.getpid()}-{version}"
        shutil.rmtree(tmp, ignore_errors=True)
        # hard links where the volume allows (a direct pipeline's version holds the ONNX model): never written again
        shutil.copytree(self.root / self.names.ensemble / str(version), tmp, copy_function=_link_or_copy)
        replace_dir(tmp, target)

    def drop_candidate(self) -> None:
        """Remove the candidate route's config and version directories (after it is unloaded)."""
        shutil.rmtree(self.root / self.names.candidate, ignore_errors=True)

    def io_signature(self, model: str, version: int) -> dict[str, Any]:
        """What an ensemble pinned to another version relies on: I/O names, types, shapes, batch size."""
        cfg = parse_config(self.snapshot(model, version), f"{model}/{version}/{SNAPSHOT}")

        return {"inputs": _io(cfg.input), "outputs": _io(cfg.output), "max_batch_size": cfg.max_batch_size}
