"""MkDocs hook: put the generated configuration reference into docs/configuration.md.

The page holds a marker (:data:`seqcls_tools.docs.reference.MARKER`); this replaces it with
:func:`seqcls_tools.docs.reference.render`, built from the code at every build. A page that lost its
marker fails the build, so the reference cannot silently disappear.
"""

from __future__ import annotations

from seqcls_tools.docs.reference import MARKER, render

PAGE = "configuration.md"


def on_page_markdown(markdown, page, config, files):  # MkDocs' hook signature
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its marker {MARKER}: the generated configuration reference has no place")
    return markdown.replace(MARKER, render())
