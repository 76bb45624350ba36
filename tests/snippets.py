"""The fenced code blocks of README.md and docs/*.md, found by parsing the Markdown.

Every block is run or checked by a test (tests/integration/test_snippets.py keeps the
list), or carries a marker on the line just before its fence saying why it is not run;
an HTML comment, which GitHub does not show:

    <!-- snippet: not run (needs a Kubernetes cluster) -->
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- snippet: not run \(([^<>]*)\) -->")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: "README.md", "docs/operating.md"
    line: int  # of the opening fence, from 1
    info: str  # the fence's info string: "sh", "python", "json", ..., or ""
    text: str  # as a reader copies it (a fence's indentation inside a list removed)
    not_run: str | None  # the reason its marker gives, if it has one

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[str]:
    return ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def parse(page: str, text: str) -> tuple[tuple[Block, ...], tuple[str, ...]]:
    """The page's blocks, and its markers that stand before no fence (or are misspelt)."""
    fences = [t for t in MarkdownIt("commonmark").parse(text) if t.type == "fence" and t.map]
    starts = {t.map[0] for t in fences}
    reasons: dict[int, str] = {}  # a fence's line index: its marker's reason
    stray = []
    for index, line in enumerate(text.splitlines()):
        if "<!-- snippet" not in line:
            continue
        marker = MARKER.fullmatch(line.strip())
        if marker and index + 1 in starts:
            reasons[index + 1] = marker[1].strip()
        else:
            stray.append(f"{page}:{index + 1}: {line.strip()}")
    blocks = tuple(
        Block(page, t.map[0] + 1, t.info.strip(), t.content, reasons.get(t.map[0])) for t in fences
    )
    return blocks, tuple(stray)


@cache
def _page(page: str) -> tuple[tuple[Block, ...], tuple[str, ...]]:
    return parse(page, (ROOT / page).read_text())


def blocks() -> list[Block]:
    """Every fenced block of README.md and docs/*.md, in page order."""
    return [block for page in pages() for block in _page(page)[0]]


def stray_markers() -> list[str]:
    """Markers with no fence on the next line, or not spelt as MARKER: ``page:line: text``."""
    return [marker for page in pages() for marker in _page(page)[1]]


def snippet(page: str, naming: str) -> Block:
    """The one block of ``page`` whose text contains ``naming``."""
    found = [block for block in _page(page)[0] if naming in block.text]
    assert len(found) == 1, f"{len(found)} blocks of {page} contain {naming!r}, not one"
    return found[0]
