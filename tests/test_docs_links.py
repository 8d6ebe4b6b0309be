"""The README is the front door and docs/ the reference: every relative link and anchor in them resolves,
every docs page is one click from the README, the README stays short, and CI's test command is still in it."""

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+).*?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text links can live in: fenced blocks removed (headings inside them are not headings either)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its words
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for heading in HEADING.findall(prose(path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(CODE_SPAN.sub("", prose(path.read_text())))


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken(path: Path) -> list[str]:
    """The relative links in `path` whose file or anchor does not exist."""
    bad = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...: not ours to check
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target}: no file {shown(dest)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {shown(dest)}")
    return bad


def test_slugs_follow_github():
    assert slug("Where the memory went: `--memory`") == "where-the-memory-went---memory"
    assert slug("Before and after: `--diff` and `torchmagic.diff`") == "before-and-after---diff-and-torchmagicdiff"
    assert slug("Traces written elsewhere, and across ranks: `%torchprofile --load PATH`") == \
        "traces-written-elsewhere-and-across-ranks-torchprofile---load-path"


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Part two\n\n[ok](#part-two) [ok](b.md#b) [bad](#nope)\n"
                                   "[bad](missing.md) [bad](b.md#nope) `[skipped](nowhere.md)` [web](https://x.org)\n"
                                   "```\n[skipped](nowhere.md)\n# not a heading\n```\n[bad](#not-a-heading)\n")
    (tmp_path / "b.md").write_text("# B\n")
    found = broken(tmp_path / "a.md")
    assert [b.split(":")[0] for b in found] == ["#nope", "missing.md", "b.md#nope", "#not-a-heading"]


@pytest.mark.parametrize("page", PAGES, ids=shown)
def test_every_relative_link_resolves(page):
    assert broken(page) == []


def test_every_docs_page_is_one_click_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(README)}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert missing == []


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    # .ci/run runs the line two after the marker: it must be the install-and-test command
    lines = text.splitlines()
    at = lines.index("<!-- test-command -->")
    assert lines[at + 1] == "```bash"
    assert "pip install" in lines[at + 2] and "python -m pytest" in lines[at + 2]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text  # the CPU-only install
    assert (ROOT / "docs" / "images" / "report.png").stat().st_size < 200_000
