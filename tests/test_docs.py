"""The docs hold together: docs/design.md stays a design (under 500 lines; its dated journal
lives in docs/notes/, every note linked from it); every `design.md, "Section"` reference in the
code and docs names a heading or an emphasised paragraph title there; every relative Markdown
link (and its #anchor) in README.md and docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SOURCES = [*DOCS, *sorted(ROOT.glob("radixflow_sglang/**/*.py")), *sorted(ROOT.glob("eval/*.py")),
           *(p for p in sorted(ROOT.glob("tests/*.py")) if p.name != "test_docs.py")]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def headings(text: str) -> list[str]:
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]


def titles(text: str) -> set[str]:
    """A section's names: its headings and emphasised spans, lower case, end punctuation off."""
    spans = re.findall(r"\*{1,2}([^*\n]+?)\*{1,2}", text) + headings(text)
    return {s.strip().rstrip(".:").lower() for s in spans}


def references(text: str) -> list[str]:
    """`design.md, "A", "B"` references, also where a comment or docstring wraps them."""
    flat = re.sub(r"\s*\n\s*(#\s*)?", " ", text)
    out = []
    for group in re.findall(r'design\.md(?:,\s*|\s+)((?:"[^"]+"(?:,\s*)?)+)', flat):
        out += re.findall(r'"([^"]+)"', group)
    return out


def test_design_is_a_design_and_links_every_note():
    text = DESIGN.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 500
    linked = set(re.findall(r"\]\((notes/[^)#]+)\)", text))
    notes = {f"notes/{p.name}" for p in (ROOT / "docs" / "notes").glob("*.md")}
    assert notes and linked == notes


def test_references_to_design_sections_resolve():
    names = titles(DESIGN.read_text(encoding="utf-8"))
    refs = {(p.relative_to(ROOT).as_posix(), r) for p in SOURCES
            for r in references(p.read_text(encoding="utf-8"))}
    assert len(refs) > 20  # NOTE: the parser still finds the code's references
    missing = sorted((p, r) for p, r in refs if r.lower().rstrip(".") not in names)
    assert missing == []


def test_markdown_links_resolve():
    bad = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # NOTE: http(s), mailto: not checked offline
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.is_file():
                bad.append((doc.name, target))
            elif anchor and anchor not in {slug(h) for h in headings(dest.read_text("utf-8"))}:
                bad.append((doc.name, target))
    assert bad == []


def test_the_reference_parser_and_slugs():
    text = 'x (docs/design.md, "The wait\n    # decision", "Cold fits") y design.md "Z"'
    assert references(text) == ["The wait decision", "Cold fits", "Z"]
    assert slug("A released consumer's round") == "a-released-consumers-round"
    assert slug("no_buffer fork slots, hidden sharers") == "no_buffer-fork-slots-hidden-sharers"
