r"""MkDocs hooks (mkdocs.yml `hooks:`): the site's front page is the repository's README,
and table cells read the same on the site as on the repository host.

`docs/index.md` is a placeholder; on a build its Markdown is replaced by README.md's,
with the README's links into `docs/` made relative to the site (`docs/guides/x.md` ->
`guides/x.md`), so one file is the front page on the repository host and on the site,
and `mkdocs build --strict` checks its links like any page's.

A pipe inside a code span of a table row must be written `\|` for the repository host
(GitHub splits cells on it even there) but Python-Markdown keeps the backslash in the
code: the site gets the plain pipe."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def site_readme(text: str) -> str:
    """README.md as the site's index page: links and images into docs/ made relative
    to the site's root."""
    text = re.sub(r"\]\(docs/", "](", text)
    return re.sub(r'(src|href)="docs/', r'\1="', text)


CODE = re.compile(r"(`+)(.+?)\1")


def table_pipes(text: str) -> str:
    r"""`\|` inside the code spans of table rows as a plain pipe (outside code, and
    outside tables, Markdown already reads `\|` as a pipe)."""
    def row(line: str) -> str:
        if not line.lstrip().startswith("|"):
            return line
        return CODE.sub(lambda m: m.group(0).replace("\\|", "|"), line)

    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(line if fenced else row(line))
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "index.md":
        markdown = site_readme(README.read_text(encoding="utf-8"))
    return table_pipes(markdown)
