"""What a benchmark run measures and how long it may take: profiles, client grid, budgets, configurations."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from seqcls.serving.repository import ServingOptions
from seqcls_tools.bench.model import MEDIUM, TINY, ModelSpec

PROFILES = ("fp32", "fp32-fused", "int8")
#: Profiles the bench adds where this host can build and serve them (``seqcls.spec.host_refusal`` says why not).
HOST_PROFILES = ("bf16",)
CLIENTS = (1, 4, 8)
TEXTS_PER_REQUEST = (1, 8)
#: In-process runs: (texts per batch, each text run on its own). "8 per text" is what a model
#: that never pads across texts would do with an 8-text request.
INPROCESS_RUNS = ((1, False), (8, False), (8, True))
CLASSIC = ServingOptions(
    tokenizer_impl="paddlenlp",
    dynamic_batching=False,
    graph_optimization_level="basic",
    model_instances=1,
    batching="per-request",
)


@dataclass(frozen=True)
class Budget:
    """Bounds of every loop (requests and seconds): the run's length is decided here."""

    corpus: int
    golden: int
    cell_seconds: float
    cell_requests: int
    warmup_seconds: float
    inprocess_seconds: float
    inprocess_batches: int
    tokenizer_seconds: float
    reload_load_seconds: float
    h2h_rounds: int
    h2h_seconds: float
    lone_requests: int


#: Every bound of the full run and of ``--quick``, side by side: field -> (full, quick).
_BUDGETS: dict[str, tuple[Any, Any]] = {
    "corpus": (2000, 200),
    "golden": (64, 32),
    "cell_seconds": (8.0, 0.8),
    "cell_requests": (3000, 40),
    "warmup_seconds": (2.0, 0.3),
    "inprocess_seconds": (4.0, 0.4),
    "inprocess_batches": (2000, 40),
    "tokenizer_seconds": (2.0, 0.3),
    "reload_load_seconds": (120.0, 60.0),
    "h2h_rounds": (3, 1),
    "h2h_seconds": (7.0, 0.5),
    "lone_requests": (300, 30),
}
FULL = Budget(**{name: full for name, (full, _) in _BUDGETS.items()})
QUICK = Budget(**{name: quick for name, (_, quick) in _BUDGETS.items()})


@dataclass(frozen=True)
class ServingConfig:
    name: str
    profile: str
    options: ServingOptions
    group: str  # "classic" | "main" | "variant"
    note: str = ""

    @property
    def layout(self) -> str:
        o = self.options
        return f"{o.model_instances}x{o.intra_op_threads}"

    def describe(self) -> str:
        o = self.options
        parts = [
            f"tokenizer {o.tokenizer_impl}",
            "dyn-batch" if o.dynamic_batching else "no dyn-batch",
            f"{o.model_instances} inst x {o.intra_op_threads} thr",
            o.batching,
            f"pad {o.padding}",
            f"ORT {o.graph_optimization_level}",
        ]
        return ", ".join(parts)


def host_profiles() -> tuple[tuple[str, ...], dict[str, str]]:
    """The profiles this run releases: :data:`PROFILES`, plus each of :data:`HOST_PROFILES` this host can run
    (bf16: a CPU with avx512_bf16 or amx_bf16, OpenVINO importable); and why each other one is left out."""
    from seqcls.spec import host_refusal

    refusals = {p: host_refusal(p, providers=("CPUExecutionProvider",)) for p in HOST_PROFILES}
    left_out = {p: r for p, r in refusals.items() if r}
    return (*PROFILES, *(p for p in HOST_PROFILES if p not in left_out)), left_out


def fp32_variants() -> list[ServingConfig]:
    base = ServingOptions()
    return [
        ServingConfig("fp32", "fp32", base, "main", "default CPU options"),
        ServingConfig(
            "fp32 pad-to-longest", "fp32", replace(base, batching="pad-to-longest"), "variant", "GPU-style batching"
        ),
        ServingConfig(
            "fp32 group-by-length",
            "fp32",
            replace(base, padding="buckets", batching="group-by-length"),
            "variant",
            "length buckets, same-length requests run together",
        ),
        ServingConfig(
            "fp32 2x1",
            "fp32",
            replace(base, dynamic_batching=False, model_instances=2, intra_op_threads=1),
            "variant",
            "two single-threaded instances, requests go to a free instance",
        ),
        ServingConfig(
            "fp32 2x2",
            "fp32",
            replace(base, dynamic_batching=False, model_instances=2, intra_op_threads=2),
            "variant",
            "two instances x two threads (oversubscribed under load)",
        ),
    ]


@dataclass
class BenchConfig:
    out: Path
    quick: bool = False
    seed: int = 0
    keep_work: bool = False
    variants: bool | None = None  # default: on in full mode, off in --quick
    spec: ModelSpec | None = None
    budget: Budget | None = None

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.spec is None:
            self.spec = TINY if self.quick else MEDIUM
        if self.budget is None:
            self.budget = QUICK if self.quick else FULL
        if self.variants is None:
            self.variants = not self.quick
