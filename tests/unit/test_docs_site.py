"""The documentation site builds with `mkdocs build --strict` (a broken link or anchor,
or a page left out of the nav, fails it), shows offline (no web font, no script or
stylesheet from another origin, nothing that makes the theme fetch one), has the README
as its front page, and the README stays a front page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from mkdocs_hooks import site_readme, table_pipes  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir",
         str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    return out


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    # Hand-off notes between branches (docs/_handoff/) are excluded (mkdocs.yml).
    pages = {p.relative_to(REPO / "docs").with_suffix("").as_posix()
             for p in (REPO / "docs").rglob("*.md")
             if p.relative_to(REPO / "docs").parts[0] != "_handoff"}
    for page in pages:
        folder = page.removesuffix("index").rstrip("/")
        built = site / folder / "index.html"
        assert built.is_file(), page


def test_the_site_fetches_nothing_from_another_origin(site: Path) -> None:
    theme = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert "font: false" in theme  # no Google Fonts
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        loads = re.findall(r'<(?:script|img|iframe)[^>]*\ssrc="([^"]+)"', text)
        loads += re.findall(r'<link[^>]*\shref="([^"]+)"', text)
        remote = [u for u in loads if re.match(r"(https?:)?//", u)]
        assert not remote, (html, remote)
        assert "fonts.googleapis" not in text, html
        assert "fonts.gstatic" not in text, html
        # The theme fetches Mermaid from a CDN for a `mermaid` block: there is none.
        assert 'class="mermaid"' not in text, html
        # A table's `a\|b` (written so for the repository host) shows as `a|b`.
        assert "\\|" not in text, html


def test_the_front_page_is_the_readme(site: Path) -> None:
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "What to read next" in index
    assert 'src="diagrams/architecture.svg"' in index
    assert 'href="guides/cli/"' in index  # docs/guides/cli.md, as a page of the site
    assert (site / "diagrams" / "architecture.svg").is_file()


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "make run" in readme
    assert "make test" in readme
    assert "docs/diagrams/architecture.svg" in readme
    # Every page it links to exists (the site's build checks them again).
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / target).is_file(), target


def test_the_readme_links_into_the_site() -> None:
    assert site_readme("[x](docs/guides/cli.md) ![d](docs/diagrams/a.svg)") == (
        "[x](guides/cli.md) ![d](diagrams/a.svg)")
    assert site_readme('<img src="docs/a.svg">') == '<img src="a.svg">'
    assert site_readme("[y](#layout) [z](https://example.org/docs/x)") == (
        "[y](#layout) [z](https://example.org/docs/x)")


def test_a_pipe_in_a_tables_code_reads_plain_on_the_site() -> None:
    page = "| `a\\|b` | x \\| y |\n```sh\nx \\| y\n```\n`c\\|d` outside a table\n"
    assert table_pipes(page) == (
        "| `a|b` | x \\| y |\n```sh\nx \\| y\n```\n`c\\|d` outside a table\n")
