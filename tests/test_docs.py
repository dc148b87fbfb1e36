"""The documentation holds together: README.md and docs/ link only to files that are there, and the site
(mkdocs.yml) lists every page of docs/. Fast, without mkdocs; CI's `mkdocs build --strict` checks the
site's own links and anchors too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from .conftest import REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
# [text](target) and ![alt](target), with an optional "title"; and [name]: target definitions.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def prose(text: str) -> str:
    """The text without its code blocks and code spans: a path in code is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(path: Path) -> list[str]:
    text = prose(path.read_text(encoding="utf-8"))
    return INLINE_LINK.findall(text) + REFERENCE.findall(text)


def is_relative(target: str) -> bool:
    return not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|//|#", target)


def github_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, each space a hyphen."""
    found: set[str] = set()
    if not page.is_file():
        return found
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def nav_files(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_files(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_files(value)]
    return []


def test_the_pages_are_there() -> None:
    assert (REPO / "README.md").is_file() and (DOCS / "index.md").is_file()
    assert (DOCS / "facts" / "README.md").is_file()


@pytest.mark.parametrize("page", [REPO / "README.md", *PAGES], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_files_that_exist(page: Path) -> None:
    broken = []
    for target in filter(is_relative, links(page)):
        path, _, anchor = target.partition("#")
        path = path.partition("?")[0]
        resolved = (page.parent / path).resolve()
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif page.is_relative_to(DOCS) and not resolved.is_relative_to(DOCS):
            broken.append(f"{target}: outside docs/, which is all the site has (name it in `code`)")
        elif page == REPO / "README.md" and anchor and anchor not in github_anchors(resolved):
            # README.md is read on GitHub: its anchors must be GitHub's (mkdocs checks the site's).
            broken.append(f"{target}: {resolved.name} has no heading with that anchor on GitHub")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_links_to_the_docs_as_files() -> None:
    """On GitHub a link to docs/ shows a folder listing: the README names each page's file."""
    targets = [t for t in links(REPO / "README.md") if is_relative(t) and t.startswith("docs")]
    assert targets, "the README links to no page of docs/"
    assert all(t.partition("#")[0].endswith(".md") for t in targets), targets


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config.get("docs_dir", "docs") == "docs"
    listed = nav_files(config["nav"])
    assert len(listed) == len(set(listed)), f"a page is in the nav twice: {listed}"
    pages = {str(p.relative_to(DOCS)) for p in PAGES}
    assert not set(listed) - pages, f"in the nav but not in docs/: {sorted(set(listed) - pages)}"
    assert not pages - set(listed), f"in docs/ but not in mkdocs.yml's nav: {sorted(pages - set(listed))}"
