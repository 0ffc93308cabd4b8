"""One release parameter's contract, written once: its JSON-schema words (what Airflow's Params validate),
how a value is checked (:meth:`Field.check`) and how a number typed as text is read exactly
(:meth:`Field.parse`). :data:`seqcls.config.FIELDS` is the table of them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from seqcls.errors import InputError

#: A non-negative decimal or scientific number as typed (no sign, nan, inf or ``_``; ASCII digits).
NUMBER_TEXT = r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"


@dataclass(frozen=True)
class Field:
    """One release parameter's contract (JSON-schema words, so Params can use it as it is)."""

    name: str
    type: str  # integer | number | boolean | string | object
    title: str
    description: str = ""
    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False  # bounds are exclusive (probabilities)
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    nullable: bool = False
    section: str | None = None  # the trigger form's section (None: everyday, the first one)
    examples: tuple[str, ...] = ()  # a number's typical values, as the form suggests them

    @property
    def as_text(self) -> bool:
        """Entered as text in the trigger form (a number: Airflow's number widget is not exact)."""
        return self.type == "number"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def schema(self) -> dict[str, Any]:
        """JSON schema of the value (what Airflow's Param validates at trigger time).

        A number may come as text (the form's, checked by ``pattern``; its range is checked when parsed)
        or as a JSON number (a REST conf, a models-file default; ranged here). ``string`` first, with
        ``examples``: Airflow 3's form then renders its plain text input.
        """
        kind: str | list[str] = ["string", "number"] if self.as_text else self.type
        if self.nullable:
            kind = [*([kind] if isinstance(kind, str) else kind), "null"]
        out: dict[str, Any] = {"type": kind}
        lo, hi = ("exclusiveMinimum", "exclusiveMaximum") if self.exclusive else ("minimum", "maximum")
        if self.minimum is not None:
            out[lo] = self.minimum
        if self.maximum is not None:
            out[hi] = self.maximum
        if self.enum:
            out["enum"] = [*self.enum, *([None] if self.nullable else [])]  # unset is a valid choice
        if self.pattern or self.as_text:
            out["pattern"] = self.pattern or NUMBER_TEXT
        if self.as_text:
            out["examples"] = list(self.examples)
        if self.name == "thresholds":
            out["additionalProperties"] = PROBABILITY
        return out

    def check(self, value: Any, name: str | None = None) -> None:
        name = name or self.name
        if value is None and self.nullable:
            return
        numeric = self.type in ("integer", "number")
        if self.type == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
            raise InputError(f"{name} must be an integer{self._range()}, got {value!r}")
        if self.type == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InputError(f"{name} must be a number{self._range()}, got {value!r}")
        if numeric and not self._in_range(value):
            raise InputError(f"{name} must be {self.type_word()}{self._range()}, got {value!r}")
        if self.type == "boolean" and not isinstance(value, bool):
            raise InputError(f"{name} must be true or false, got {value!r}")
        if self.enum and value not in self.enum:
            raise InputError(f"{name} must be one of {', '.join(self.enum)}, got {value!r}")
        if self.type == "object":
            if not isinstance(value, dict):
                raise InputError(f"{name} must be a mapping label -> threshold, got {value!r}")
            for key, item in value.items():
                _PROB_FIELD.check(item, f"{name}[{key!r}]")

    def parse(self, value: Any, name: str | None = None) -> Any:
        """``value`` as the field's type: a number typed as text → ``float`` (exactly what ``float()`` reads
        from it); anything else as given (:meth:`check` judges it)."""
        if not (self.as_text and isinstance(value, str)):
            return value
        if not re.fullmatch(NUMBER_TEXT, value):
            raise InputError(
                f"{name or self.name} must be {self.type_word()}{self._range()} written like 1e-4 or 0.0001, "
                f"got {value!r}"
            )
        return float(value)

    def type_word(self) -> str:
        return "an integer" if self.type == "integer" else "a number"

    def _in_range(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.exclusive:
            return (self.minimum is None or value > self.minimum) and (self.maximum is None or value < self.maximum)
        return (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)

    def _range(self) -> str:
        if self.minimum is None and self.maximum is None:
            return ""
        if self.exclusive:
            return f" strictly between {self.minimum:g} and {self.maximum:g}"
        return f" in [{self.minimum:g}, {self.maximum:g}]"


PROBABILITY = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}
_PROB_FIELD = Field("threshold", "number", "Threshold", minimum=0, maximum=1, exclusive=True)
