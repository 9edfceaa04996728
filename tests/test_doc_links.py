"""Every relative link in the README, docs/ and bench/results/ points at a file that exists,
and every #anchor at a heading of its page (GitHub's anchors)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("bench/results/*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """The page without its fenced code blocks, where brackets are not links."""
    lines, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
        elif not inside:
            lines.append(line)
    return "\n".join(lines)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(line.lstrip("#")) for line in prose(page.read_text()).splitlines() if line.startswith("#")}


def broken(page: Path) -> list[str]:
    found = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            found.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            found.append(f"{target}: no heading #{frag} in {dest.name}")
    return found


def test_anchor_follows_github() -> None:
    assert anchor("Quick start (fresh Linux or macOS machine, Python >= 3.10, a C++ compiler)") == (
        "quick-start-fresh-linux-or-macos-machine-python--310-a-c-compiler"
    )
    assert anchor("Several models, and replicas") == "several-models-and-replicas"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[there](missing.md) [here](#title) [gone](#nothing)\n\n```\n[code](x.md)\n```\n")
    assert broken(page) == ["missing.md: no such file", "#nothing: no heading #nothing in page.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert broken(page) == []
