"""Release outcomes, told to people through Apprise: promoted, refused (and why), failed and withdrawn,
rolled back.

- :mod:`~seqcls.notify.outcome` — :class:`Outcome`, built from what a release already records (its
  workspace, the serving state and log), and :func:`classify` (refused vs failed);
- :mod:`~seqcls.notify.message` — :func:`render`: a title and a short plain-text body, the reason first;
- :mod:`~seqcls.notify.delivery` — :func:`check_urls`, :func:`masked`, :func:`send` (never raises: a
  notification failing is a warning, never the release's error);
- :mod:`~seqcls.notify.commands` — the CLI's ``SEQCLS_NOTIFY_URLS``.

Where the URLs come from: the models file's per-model ``notify:`` (Airflow, :mod:`seqcls.airflow.outcome`),
``SEQCLS_NOTIFY_URLS`` (the CLI). Imports no Airflow, and Apprise only when URLs are used.
"""

from seqcls.notify.delivery import NotifyResult, check_urls, masked, send, split_urls, url_secrets
from seqcls.notify.message import render
from seqcls.notify.outcome import (
    FAILED,
    KINDS,
    PROMOTED,
    REFUSED,
    ROLLED_BACK,
    SKIPPED,
    Outcome,
    ReleaseFacts,
    classify,
    release_facts,
)

__all__ = [
    "FAILED",
    "KINDS",
    "PROMOTED",
    "REFUSED",
    "ROLLED_BACK",
    "SKIPPED",
    "NotifyResult",
    "Outcome",
    "ReleaseFacts",
    "check_urls",
    "classify",
    "masked",
    "release_facts",
    "render",
    "send",
    "split_urls",
    "url_secrets",
]
