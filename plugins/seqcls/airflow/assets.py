"""The Airflow Assets of a model: its checkpoints (what a training pipeline updates) and its champion.

- ``seqcls://checkpoints/<model>`` — a release DAG with ``schedule: asset`` runs when it is updated
  (a training DAG's ``outlets``, or ``POST /api/v2/assets/events``).
- ``seqcls://models/<model>/champion`` — the ``promote`` task's outlet: an event whenever promote
  *succeeds* (the version is served and MLflow's ``champion`` points at it), with extra
  ``{"version": <MLflow version>, "triton_version": <N>, "fingerprint": <checkpoint sha256>}``.
  A skipped run (already champion) or a failed promote emits nothing: Airflow records a task's
  outlet events only when it succeeds. Downstream DAGs schedule on it, e.g.
  ``schedule=[Asset(uri="seqcls://models/alpha/champion")]``, and read the extra from
  ``triggering_asset_events``.

Each Asset's name *is* its URI, so a consumer's ``Asset(uri=...)`` (whose name defaults to the
URI) is the same asset, not a second one competing for the URI (Airflow keeps names and URIs
each unique among active assets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Asset

CHECKPOINTS_URI = "seqcls://checkpoints/{model}"
CHAMPION_URI = "seqcls://models/{model}/champion"
#: The champion event's extra: its key → the promote task's summary key it comes from.
CHAMPION_EXTRA = {"version": "version", "triton_version": "triton_version", "fingerprint": "fingerprint"}


def checkpoints_asset(model_name: str) -> Asset:
    uri = CHECKPOINTS_URI.format(model=model_name)
    return Asset(name=uri, uri=uri)


def champion_asset(model_name: str) -> Asset:
    uri = CHAMPION_URI.format(model=model_name)
    return Asset(name=uri, uri=uri)


def champion_extra(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The champion event's extra from the promote task's summary (``run_task_step``'s return)."""
    missing = [key for key in CHAMPION_EXTRA.values() if summary.get(key) in (None, "")]
    if missing:
        raise ValueError(f"promote summary lacks {', '.join(missing)}: {dict(summary)}")
    return {extra: summary[key] for extra, key in CHAMPION_EXTRA.items()}


def record_champion(outlet_events, model_name: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """Attach the champion extra to this task's event for ``model_name``'s champion Asset (one of the
    task's ``outlets``); Airflow emits it when the task succeeds. Returns the extra."""
    promoted = summary.get("model_name")
    if promoted != model_name:
        raise ValueError(f"promote released {promoted!r}, not {model_name!r}: no {model_name!r} champion event")
    extra = champion_extra(summary)
    outlet_events[champion_asset(model_name)].extra.update(extra)
    return extra


__all__ = [
    "CHAMPION_EXTRA",
    "CHAMPION_URI",
    "CHECKPOINTS_URI",
    "champion_asset",
    "champion_extra",
    "checkpoints_asset",
    "record_champion",
]
