"""MkDocs hooks (mkdocs.yml `hooks:`): the site's front page is the repository's README.

`docs/index.md` is a placeholder; on a build its Markdown is replaced by README.md's,
with the README's links into `docs/` made relative to the site (`docs/guides/x.md` ->
`guides/x.md`), so one file is the front page on the repository host and on the site,
and `mkdocs build --strict` checks its links like any page's."""

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


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "index.md":
        return site_readme(README.read_text(encoding="utf-8"))
    return markdown
