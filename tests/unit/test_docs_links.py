"""README.md and docs/*.md: every relative link and #anchor points at a file and a heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
# [text](target) and ![alt](target); the text may hold one level of brackets and span lines,
# the target may be <bracketed> and be followed by a "title".
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^\s)]+)(?:\s+(?:\"[^\"\n]*\"|'[^'\n]*'))?\s*\)")
ATX_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto:, ...


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def without_fences(text: str) -> str:
    """The text with the lines of fenced code blocks blanked out (line numbers kept)."""
    lines, fence = [], None
    for line in text.split("\n"):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            lines.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return "\n".join(lines)


def prose(text: str) -> str:
    """The text outside code: fenced blocks blanked out, inline code spans replaced by blanks (newlines kept)."""
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), without_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, keep letters, digits, spaces, '-' and '_', spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, repeated headings numbered -1, -2, ... as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for line in without_fences(path.read_text(encoding="utf-8")).split("\n"):
        match = ATX_HEADING.match(line)
        if not match:
            continue
        base = slug(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1) or ""))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image outside code."""
    text = prose(path.read_text(encoding="utf-8"))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1).strip("<>")) for m in LINK.finditer(text)]


def broken_links(path: Path) -> list[str]:
    """One message per relative link whose file, or whose #anchor's heading, does not exist."""
    problems = []
    for number, target in links(path):
        if SCHEME.match(target):
            continue  # http(s), mailto and other external links
        file_part, _, anchor = target.partition("#")
        where = f"{path.name}:{number}: ({target})"
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{where}: no such file or directory {linked}")
            continue
        if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{where}: no heading with anchor #{anchor} in {linked.name}")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(path):
    assert path.exists()
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_links_every_docs_page():
    linked = {(REPO / target.partition("#")[0]).resolve() for _, target in links(REPO / "README.md")}
    pages = sorted((REPO / "docs").glob("*.md"))
    assert len(pages) >= 10
    missing = [page.name for page in pages if page.resolve() not in linked]
    assert not missing, f"docs pages the README's guide map does not link: {missing}"


def test_checker_reports_broken_links_and_ignores_code(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: with, punctuation\n")
    (tmp_path / "image.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n"
        "## Second section\n\n"
        "Good: [other](other.md), [heading](other.md#a-code-heading-with-punctuation), ![img](image.png),\n"
        "[in page](#second-section), [folder](.), [web](https://example.com/x.md), [mail](mailto:a@b.c),\n"
        "[text across\nlines](other.md#other-page) and `[not a link](missing_in_code_span.md)`.\n\n"
        "Bad: [missing file](missing.md), ![missing image](missing.png), [bad anchor](other.md#nowhere),\n"
        "[bad in-page anchor](#no-such-section).\n\n"
        "```bash\n# Heading in code\n[ignored](missing_in_fence.md)\n```\n\n"
        "[a fenced heading is no anchor](#heading-in-code)\n"
    )
    problems = broken_links(page)
    reported = [problem.split(": (")[1].split(")")[0] for problem in problems]
    assert reported == ["missing.md", "missing.png", "other.md#nowhere", "#no-such-section", "#heading-in-code"]
    assert problems[0].startswith("page.md:10: (missing.md): no such file or directory")


def test_slug_follows_githubs_rule():
    assert slug("Checkpoints, resume, Hugging Face folders") == "checkpoints-resume-hugging-face-folders"
    assert slug("hybrid vs TRL: time per GRPO step") == "hybrid-vs-trl-time-per-grpo-step"
    assert slug("Coming from SkyRL or ROLL: config dialects") == "coming-from-skyrl-or-roll-config-dialects"
    assert slug("Mapped SkyRL keys (153)") == "mapped-skyrl-keys-153"
    assert slug("Rollout: the fused worker vs standalone vLLM") == "rollout-the-fused-worker-vs-standalone-vllm"
    assert slug("Weight sync vs the engine's own reload") == "weight-sync-vs-the-engines-own-reload"
