"""Apprise URLs: checked where they are configured, shown only masked, and sent to — never failing a release.

An Apprise URL (``json://``, ``mailto://``, ``slack://``, … see https://github.com/caronc/apprise/wiki)
often carries a secret (a password, a token). Apprise itself knows which parts: ``url(privacy=True)``
masks them, and :func:`masked` is the only form seqcls logs, returns (XCom) or records.
:func:`url_secrets` names the hidden parts so the Airflow task can register them with Airflow's secrets
masker, and :func:`send` redacts them from Apprise's own log lines while it sends.

A notification failing (a service down, a bad URL) is a warning in the log and a :class:`NotifyResult`
saying so: the release it reports on has already happened and is not changed by it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import unquote

from seqcls.errors import InputError
from seqcls.notify.message import render
from seqcls.notify.outcome import FAILED, PROMOTED, REFUSED, ROLLED_BACK, Outcome

log = logging.getLogger(__name__)

#: Apprise's notification type per outcome kind (the colour or icon a service shows).
NOTIFY_TYPES = {PROMOTED: "success", REFUSED: "warning", FAILED: "failure", ROLLED_BACK: "warning"}
#: The whole send, every service together, at most this long (s): a release does not wait on a chat service.
DEFAULT_TIMEOUT = 30.0
WIKI = "https://github.com/caronc/apprise/wiki"
_SPLIT = re.compile(r"[/:@?&=#,+;\s]+")


@dataclass
class NotifyResult:
    """What :func:`send` did: the services it reached and those it did not, each masked."""

    sent: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "masked URL (why)"
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def line(self) -> str:
        total = len(self.sent) + len(self.failed)
        text = f"notified {len(self.sent)} of {total} in {self.seconds:.1f}s"
        return text + (f"; not delivered: {'; '.join(self.failed)}" if self.failed else "")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def split_urls(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """URLs from one string of space-separated URLs, or from a list of them (each may hold several too)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    return tuple(url for item in items for url in str(item).split())


def shown(url: str) -> str:
    """An URL Apprise cannot read, named without anything that may be secret: its scheme."""
    scheme, sep, _ = url.partition("://")
    return f"{scheme}://…" if sep and scheme.isidentifier() else "(no scheme://)"


def _plugin(target: Any) -> Any:
    """The Apprise service of ``target`` (an URL, or a service already made from a Connection); None if unusable."""
    import apprise  # ~0.2 s of plugin discovery: only where URLs are really used

    if not isinstance(target, str):
        return target
    parts = _SPLIT.split(target.partition("://")[2])  # which of them are secret is not known yet
    with redacting([target, *(t for t in parts if len(t) >= 6)]):
        return apprise.Apprise.instantiate(target)


def masked(target: Any) -> str:
    """``url(privacy=True)`` without its query: how an URL is named anywhere seqcls writes."""
    plugin = _plugin(target)
    if plugin is None:
        return shown(target) if isinstance(target, str) else type(target).__name__
    return str(plugin.url(privacy=True)).split("?", 1)[0]


def check_urls(value: str | Iterable[str] | None, where: str) -> tuple[str, ...]:
    """The URLs of ``value`` (see :func:`split_urls`), each one Apprise can use; else InputError naming
    ``where``, the URL's position and scheme (never the URL: it may carry a secret)."""
    listed = isinstance(value, Sequence) and all(isinstance(v, str) for v in value)
    if value is not None and not isinstance(value, str) and not listed:  # named by type: it may hold secrets
        kinds = sorted({type(v).__name__ for v in value}) if isinstance(value, Sequence) else [type(value).__name__]
        raise InputError(f"{where}: expected Apprise URLs (a list of strings, or one string), got {'/'.join(kinds)}")
    urls = split_urls(value)
    for i, url in enumerate(urls):
        check_url(url, f"{where}: URL {i + 1} of {len(urls)}")
    return urls


def check_url(url: str, where: str) -> str:
    """``url`` if Apprise can use it; else InputError naming ``where`` and the URL's scheme only."""
    if _plugin(url) is None:
        raise InputError(
            f"{where} ({shown(url)}) is not an Apprise URL Apprise can use (an unknown scheme, or a part the "
            f"service needs is missing): see {WIKI} for its form"
        )
    return url


def url_secrets(target: Any) -> list[str]:
    """The parts of an Apprise URL its masked form hides (passwords, tokens), longest first, and the URL
    itself: what the Airflow task registers with the secrets masker. [] for an unusable URL."""
    plugin = _plugin(target)
    if plugin is None:
        return []
    raw = target if isinstance(target, str) else str(plugin.url(privacy=False))
    public = {unquote(t) for t in _SPLIT.split(str(plugin.url(privacy=True)))}
    hidden = {t for t in _SPLIT.split(raw) if t and unquote(t) not in public}
    hidden |= {unquote(t) for t in hidden}
    return sorted({raw, *hidden}, key=len, reverse=True)


class _Redact(logging.Filter):
    """Replaces each secret in a record of Apprise's logger (its debug lines may show a token)."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        for secret in self.secrets:
            text = text.replace(secret, "***")
        record.msg, record.args = text, None
        return True


@contextlib.contextmanager
def redacting(secrets: Iterable[str]) -> Iterator[None]:
    """Within the block, Apprise's log lines show ``***`` for each of ``secrets``."""
    logger = logging.getLogger("apprise")
    flt = _Redact(sorted(set(secrets), key=len, reverse=True))
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


def send(targets: Iterable[Any], outcome: Outcome, *, timeout: float = DEFAULT_TIMEOUT) -> NotifyResult:
    """Send ``outcome`` (:func:`~seqcls.notify.message.render`) to every target — an Apprise URL, or a service
    made from an Airflow Apprise Connection. Never raises: what was not delivered is logged as a warning
    and listed in the result."""
    targets = list(targets)
    result, t0 = NotifyResult(), time.perf_counter()
    if not targets:
        return result
    title, body = render(outcome)
    secrets: list[str] = []
    try:
        import apprise

        secrets = [s for t in targets for s in url_secrets(t)]
        with redacting(secrets):
            services = apprise.Apprise()
            for target in targets:
                plugin = _plugin(target)
                if plugin is None or not services.add(plugin):
                    result.failed.append(f"{masked(target)} (not an Apprise URL)")
            if services:
                kind = NOTIFY_TYPES.get(outcome.kind, "info")
                answer = services.notify(body=body, title=title, notify_type=kind, body_format="text", timeout=timeout)
                for r in answer:
                    where = str(r.url).split("?", 1)[0]
                    (result.sent if r else result.failed).append(where if r else f"{where} ({r.status.name.lower()})")
    except Exception as exc:  # a notification must never become the release's error
        why = f"{type(exc).__name__}: {exc}"
        for secret in sorted(secrets, key=len, reverse=True):
            why = why.replace(secret, "***")
        result.failed.append(f"every URL ({why[:300]})")
    result.seconds = round(time.perf_counter() - t0, 3)
    (log.warning if result.failed else log.info)("%s — %s", title, result.line())
    return result


__all__ = [
    "DEFAULT_TIMEOUT",
    "NOTIFY_TYPES",
    "NotifyResult",
    "check_url",
    "check_urls",
    "masked",
    "redacting",
    "send",
    "shown",
    "split_urls",
    "url_secrets",
]
