"""What ``seqcls gc`` reports: one item per thing it looked at (collected, or kept and why), per model and home.

Its own module so the store side (:mod:`seqcls.ops.storegc`) reports in the same terms as the release home's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from seqcls.ops.disk import megabytes

#: The kinds gc reports, in its order.
WORKSPACE, FAILED, MLFLOW, EVALSET, LEFTOVER = "workspace", "failed", "mlflow", "evalset", "leftover"
EVIDENCE = "evidence"
STORE_VERSION, STORE_INCOMPLETE = "store-version", "store-incomplete"
KINDS = {
    WORKSPACE: "release workspaces' heavy artifacts",
    FAILED: "failed/ leftovers",
    EVIDENCE: "old releases' evidence, compacted into one audit record each",
    MLFLOW: "MLflow versions' heavy artifacts",
    EVALSET: "eval-set copies no longer referenced",
    LEFTOVER: "leftovers of an interrupted gc",
    STORE_VERSION: "complete versions on the object store outside retention",
    STORE_INCOMPLETE: "incomplete versions on the object store (publishes that died before their manifest)",
}


@dataclass
class Item:
    """One thing gc looked at: collected (``collect``: what it frees) or kept, and why."""

    kind: str
    path: str
    bytes: int
    collect: bool
    reasons: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)  # collect: the paths (relative to ``path``) that go

    def line(self) -> str:
        what = f"{self.path}" + (f" ({', '.join(self.parts)})" if self.parts else "")
        if self.collect:
            return f"  collect {KINDS[self.kind]}: {what} — {megabytes(self.bytes)}"
        return f"  keep {what} — {'; '.join(self.reasons)}"


@dataclass
class ModelGc:
    """What gc did (or would do) for one model."""

    model_name: str
    items: list[Item] = field(default_factory=list)
    error: str | None = None
    applied: bool = False
    deferred: int = 0  # items left for the next gc (its time budget ran out)

    def freed(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for item in self.items:
            if item.collect:
                out[item.kind] += item.bytes
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "freed": self.freed()}


@dataclass
class GcResult:
    """Per model, plus what belongs to the whole home (eval-set copies, an interrupted gc's trash)."""

    apply: bool
    models: list[ModelGc] = field(default_factory=list)
    home: list[Item] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(m.error for m in self.models)

    def freed(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for part in (*(m.freed() for m in self.models), ModelGc("", self.home).freed()):
            for kind, n in part.items():
                out[kind] += n
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "apply": self.apply,
            "ok": self.ok,
            "freed": self.freed(),
            "seconds": round(self.seconds, 3),
            "models": [m.to_dict() for m in self.models],
            "home": [asdict(i) for i in self.home],
        }

    def lines(self) -> list[str]:
        freed = self.freed()
        verb = "freed" if self.apply else "would free (dry run: nothing deleted; --apply deletes)"
        total = sum(freed.values())
        parts = ", ".join(f"{KINDS[k]} {megabytes(n)}" for k, n in freed.items() if n)
        out = [f"gc: {verb} {megabytes(total)}" + (f" — {parts}" if parts else "")]
        for m in self.models:
            out.append(f"{m.model_name}:" + (f" ✗ {m.error}" if m.error else ""))
            out += [i.line() for i in m.items]
            if m.deferred:
                out.append(f"  {m.deferred} more left for the next gc (time budget)")
        if self.home:
            out.append("home (shared by every model):")
            out += [i.line() for i in self.home]
        return out


__all__ = ["KINDS", "GcResult", "Item", "ModelGc"]
