"""Every relative link in README.md, docs/ and bench/results/README.md points at a file or folder
that exists, and every benchmark run the documents or the sources (comments in `.rs`, `.cu`,
`.py` and `.sh` files) name (`bench/results/<folder>`) is in the tree. Runs that left the tree are
cited by commit instead."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "bench" / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The sources whose comments may cite a run: the crates (kernels included), the Python package
# and its tests, the scripts. This file is left out: its own checks name made-up runs.
SOURCE_DIRS = [ROOT / "crates", ROOT / "python", ROOT / "scripts"]
SOURCE_SUFFIXES = {".rs", ".cu", ".py", ".sh"}

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


def missing_runs(text, root=ROOT):
    """The runs `text` names (`bench/results/<folder>`) that are not in the tree under `root`."""
    return [run for run in RUN.findall(text) if not (root / "bench" / "results" / run).is_dir()]


def sources():
    """Every source file that may cite a run (see SOURCE_DIRS), this test file left out."""
    out = []
    for d in SOURCE_DIRS:
        for p in sorted(d.rglob("*")):
            if p.suffix in SOURCE_SUFFIXES and p.is_file() and p != Path(__file__).resolve() \
                    and "target" not in p.relative_to(ROOT).parts[:2]:
                out.append(p)
    return out


def test_runs_cited_by_sources_exist():
    files = sources()
    assert len(files) > 50, f"found only {len(files)} source files"
    bad = {}
    for p in files:
        gone = missing_runs(p.read_text(encoding="utf-8", errors="replace"))
        if gone:
            bad[str(p.relative_to(ROOT))] = gone
    assert not bad, f"sources cite runs not in bench/results/ (cite the commit instead): {bad}"


def test_a_source_citing_a_run_that_left_is_found(tmp_path):
    (tmp_path / "bench" / "results" / "2026-01-01-x-kept").mkdir(parents=True)
    text = ("// measured (bench/results/2026-01-01-x-kept): 3 us\n"
            "/// (bench/results/2026-01-03-y-gone, run 2)\n"
            "# run 2026-01-04-z-cited, commit abc1234\n")
    assert missing_runs(text, root=tmp_path) == ["2026-01-03-y-gone"]


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
