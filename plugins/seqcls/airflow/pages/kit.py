"""What every seqcls page shares: the document head, the links bar, the verdict box, figure cards, numbers.

Everything a page shows passes :func:`html.escape` (labels, paths, error text come from files and
params); :data:`PAGE_CSP` forbids scripts and every fetch but the page's own images, so one escaping
slip is still no XSS. The font stack finds a CJK face on Linux, macOS and Windows (labels such as
``组织关系##裁员``); the CSS is inline (an air-gapped API server fetches nothing).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Label names are often Chinese: a stack that finds a CJK face on Linux, macOS and Windows.
FONTS = (
    'system-ui, "Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", "Hiragino Sans GB", '
    '"Microsoft YaHei", "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", sans-serif'
)
MONO = 'ui-monospace, Menlo, Consolas, "Noto Sans Mono CJK SC", "WenQuanYi Zen Hei Mono", monospace'
#: Everything on the page is escaped; the policy still forbids scripts, so one escaping slip is not an XSS.
PAGE_CSP = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'"
STYLE = (
    f"body{{font-family:{FONTS};margin:0;color:#1f2328;background:#f6f8fa;line-height:1.45}}"
    f"code,pre{{font-family:{MONO};font-size:.9em}}"
    "main{max-width:76em;margin:0 auto;padding:.8em 1.5em 3em}"
    "nav.links{display:flex;flex-wrap:wrap;gap:.3em 1.4em;padding:.55em 1.5em;background:#fff;"
    "border-bottom:1px solid #d0d7de;font-size:.93em}"
    "nav.links .where{font-weight:600}nav.links .off{color:#57606a}"
    "a{color:#0969da;text-decoration:none}a:hover{text-decoration:underline}"
    ".verdict{border:1px solid #d0d7de;border-left-width:6px;border-radius:6px;padding:.6em 1em;margin:.8em 0;"
    "background:#fff}.verdict h1{margin:0 0 .2em;font-size:1.45em}.verdict p{margin:.3em 0}"
    ".verdict.passed{border-color:#1a7f37}.verdict.passed h1{color:#1a7f37}"
    ".verdict.failed,.verdict.refused{border-color:#cf222e}.verdict.failed h1,.verdict.refused h1{color:#cf222e}"
    ".verdict.skipped,.verdict.not-run{border-color:#8c959f}.verdict>p,.verdict>pre{color:#1f2328}"
    ".cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(15em,1fr));gap:.7em;margin:.8em 0 1.2em}"
    ".card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.5em .8em}"
    ".card.bad{border-color:#cf222e;background:#fff5f5}.card .k{color:#57606a;font-size:.85em}"
    ".card .v{font-size:1.3em;font-variant-numeric:tabular-nums}.card .s{color:#57606a;font-size:.82em}"
    "h2{font-size:1.15em;margin:1.4em 0 .4em}"
    "table{border-collapse:collapse;margin:.4em 0 1em;background:#fff}"
    "th,td{border:1px solid #d0d7de;padding:.22em .6em;text-align:left;vertical-align:top}"
    "th{background:#f6f8fa;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}"
    "td>code{white-space:nowrap}"
    ".worse{color:#cf222e}.better{color:#1a7f37}.muted,.same{color:#57606a}"
    ".passed{color:#1a7f37}.refused,.failed{color:#cf222e}.skipped{color:#57606a}"
    "details{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.4em .8em;margin:.6em 0}"
    "summary{cursor:pointer;font-weight:600}figure{margin:.6em 0 1em}"
    "img.plot{max-width:100%;border:1px solid #d0d7de;border-radius:6px;background:#fff}"
    "pre{white-space:pre-wrap;background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.6em}"
    ".kind{display:inline-block;padding:0 .45em;border-radius:1em;background:#eaeef2;font-size:.88em}"
    ".kind.expose,.kind.promote{background:#dafbe1}.kind.refused{background:#ffebe9}"
    ".kind.rollback,.kind.withdraw{background:#fff8c5}"
)


@dataclass(frozen=True)
class Link:
    """One entry of the links bar: a label and where it goes; without ``href``, the label and ``note``
    as plain text (say why there is no link rather than hiding the entry)."""

    label: str
    href: str | None = None
    note: str = ""


def e(value: Any) -> str:
    """The value as escaped text (``None`` → empty)."""
    return html.escape("" if value is None else str(value))


def head(title: str, where: str, links: Sequence[Link]) -> str:
    """The document's start (UTF-8, the style, the title escaped), the links bar, and ``<main>``."""
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<style>{STYLE}</style></head><body>{links_bar(where, links)}<main>"
    )


def foot() -> str:
    return "</main></body></html>"


def links_bar(where: str, links: Sequence[Link]) -> str:
    """``where`` (this page) first, then each link (``rel=noopener`` for another site)."""
    items = [f"<span class='where'>{e(where)}</span>"]
    for link in links:
        if link.href:
            rel = " rel='noopener noreferrer'" if link.href.startswith(("http://", "https://")) else ""
            items.append(f"<a href='{e(link.href)}'{rel}>{e(link.label)}</a>")
        else:
            note = f": {link.note}" if link.note else ""
            items.append(f"<span class='off'>{e(link.label)}{e(note)}</span>")
    return f"<nav class='links'>{''.join(items)}</nav>"


def verdict(state: str, title: str, body: str = "") -> str:
    """The answer first: a box coloured by ``state`` (passed, failed, refused, skipped, not run); ``body``
    is HTML the caller escaped."""
    kind = state.replace(" ", "-")
    return f"<section class='verdict {e(kind)}'><h1 class='{e(kind)}'>{e(title)}</h1>{body}</section>"


def card(label: str, value: str, sub: str = "", *, bad: bool = False) -> str:
    """One key figure: what it is, the value, a line of context (all escaped here)."""
    cls = "card bad" if bad else "card"
    sub_html = f"<div class='s'>{e(sub)}</div>" if sub else ""
    return f"<div class='{cls}'><div class='k'>{e(label)}</div><div class='v'>{e(value)}</div>{sub_html}</div>"


def cards(items: Sequence[str]) -> str:
    return f"<section class='cards'>{''.join(items)}</section>" if items else ""


def figure(src: str, alt: str) -> str:
    return f"<figure><img class='plot' alt='{e(alt)}' src='{e(src)}'></figure>"


def number(value: Any) -> str:
    """A metric as the tables show it: 4 decimals, integers as they are, — for none, NaN spelled out."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return str(value) if isinstance(value, int) else ("NaN" if math.isnan(value) else f"{value:.4f}")


def short(value: Any) -> str:
    """A measured difference or tolerance: 3 significant digits (``3.34e-06``), — for none."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return f"{value:.3g}"


def folded(summary: str, body: str, *, open_: bool = False) -> str:
    """``<details>``: what is evidence but not the answer (``summary`` escaped here, ``body`` HTML)."""
    return f"<details{' open' if open_ else ''}><summary>{e(summary)}</summary>{body}</details>"


def rows_table(rows: Sequence[tuple[str, str]], cls: str = "") -> str:
    """A two-column table of (name, value) — both escaped here."""
    body = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
    attr = f" class='{e(cls)}'" if cls else ""
    return f"<table{attr}>{body}</table>" if rows else ""


__all__ = [
    "FONTS",
    "PAGE_CSP",
    "STYLE",
    "Link",
    "card",
    "cards",
    "e",
    "figure",
    "folded",
    "foot",
    "head",
    "links_bar",
    "number",
    "rows_table",
    "short",
    "verdict",
]
