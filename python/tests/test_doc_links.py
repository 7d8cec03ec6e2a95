"""Every relative link in README.md, docs/ and bench/results/README.md points at a file or folder
that exists, and every benchmark run the documents name (`bench/results/<folder>`) is in the tree.
Runs that left the tree are cited by commit instead."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "bench" / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target), the target up to a space (a title may follow) or ')'.
INLINE = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target
REFERENCE = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
RUN = re.compile(r"bench/results/(\d{4}-\d{2}-\d{2}-[A-Za-z0-9._-]*[A-Za-z0-9_])")


def links(text):
    """The link targets of a markdown text, code blocks and code spans left out."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE.findall(text) + REFERENCE.findall(text)


def broken(doc, text, root=ROOT):
    """(what, target) for every relative link of `doc` (a path under `root`) that does not
    resolve, and every named benchmark run that is not in the tree."""
    out = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL, mailto:, or an anchor in the same page
        path = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (root / path.lstrip("/")) if path.startswith("/") else (doc.parent / path)
        if not resolved.exists():
            out.append(("link", target))
    for run in RUN.findall(text):
        if not (root / "bench" / "results" / run).is_dir():
            out.append(("run", run))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc):
    assert doc.is_file(), f"{doc} is missing"
    bad = broken(doc, doc.read_text(encoding="utf-8"))
    assert not bad, f"{doc.relative_to(ROOT)}: broken {bad}"


def test_docs_are_found():
    names = {p.name for p in DOCS}
    assert {"README.md", "tuning.md", "quant-accuracy.md"} <= names


def test_checker_finds_what_is_missing(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench" / "results" / "2026-01-01-x-kept").mkdir(parents=True)
    (tmp_path / "docs" / "a.md").write_text("a")
    doc = tmp_path / "docs" / "b.md"
    text = (
        "[ok](a.md) [ok](a.md#part) ![img](../bench/results/2026-01-01-x-kept/) "
        "[web](https://example.com/x) [here](#top) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n"
        "[gone](missing.md) ![gone](../img/none.png \"title\")\n"
        "[ref]: ../nothing/\n"
        "runs: bench/results/2026-01-01-x-kept, bench/results/2026-01-02-x-gone.\n"
    )
    assert broken(doc, text, root=tmp_path) == [
        ("link", "missing.md"),
        ("link", "../img/none.png"),
        ("link", "../nothing/"),
        ("run", "2026-01-02-x-gone"),
    ]
