//! The crate's layering, held by `cargo test`: no import cycle between the top-level modules of
//! `crates/ferrocomm/src`, and none of the arrows docs/design.md forbids.
//!
//! A module is a file at `src/` or a folder under it; it imports another when its source names
//! `crate::other` (in a `use` or a path, `use crate::{a, b}` groups included). Comments are not
//! read. `lib.rs`, which declares every module, is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the modules it imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The text of `line` without its `//` comment (a `//` inside a string literal is kept).
fn strip_comment(line: &str) -> &str {
    let mut in_str = false;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '"' if prev != '\\' => in_str = !in_str,
            '/' if !in_str && prev == '/' => return &line[..i - 1],
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    line
}

/// The first identifier at the start of `s` (after whitespace).
fn ident(s: &str) -> Option<&str> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (end > 0).then(|| &s[..end])
}

/// The modules a source text names after `crate::`.
fn imports(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(strip_comment)
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        // `ferrocomm::crate::` cannot occur; an identifier ending in `crate` (`mycrate::`) is
        // not the crate root.
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let t = rest.trim_start();
        if let Some(group) = t.strip_prefix('{') {
            // A group: the first identifier of each top-level item.
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    _ if item_start && !c.is_whitespace() => {
                        item_start = false;
                        if let Some(id) = ident(&group[i..]) {
                            out.insert(id.to_string());
                        }
                    }
                    _ => {}
                }
            }
        } else if let Some(id) = ident(t) {
            out.insert(id.to_string());
        }
    }
    out.remove("self");
    out
}

/// The import graph of a crate's sources, given as (path relative to `src/`, text).
fn graph<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Graph {
    let mut g = Graph::new();
    let mut modules = BTreeSet::new();
    let mut raw = Vec::new();
    for (path, text) in files {
        if path == "lib.rs" || path == "main.rs" {
            continue;
        }
        let first = path.split('/').next().unwrap_or(path);
        let module = first.strip_suffix(".rs").unwrap_or(first).to_string();
        modules.insert(module.clone());
        raw.push((module, imports(text)));
    }
    for (module, deps) in raw {
        let entry = g.entry(module.clone()).or_default();
        // Only names of modules count (`crate::Result` is a re-export at the root).
        entry.extend(
            deps.into_iter()
                .filter(|d| *d != module && modules.contains(d)),
        );
    }
    g
}

/// One import cycle of `g` (its modules in order, the first repeated at the end), if any.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit<'a>(
        g: &'a Graph,
        m: &'a str,
        marks: &mut BTreeMap<&'a str, Mark>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        marks.insert(m, Mark::Open);
        path.push(m);
        for d in g.get(m).into_iter().flatten() {
            match marks.get(d.as_str()).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let from = path.iter().position(|p| *p == d).unwrap_or(0);
                    let mut cycle: Vec<String> =
                        path[from..].iter().map(|s| s.to_string()).collect();
                    cycle.push(d.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(g, d, marks, path) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(m, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in g.keys() {
        if marks.get(m.as_str()).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(g, m, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Every `.rs` file under `dir`, as (path relative to `root`, text).
fn sources(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(root, &p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            out.push((rel, text));
        }
    }
}

fn crate_graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(files.len() > 20, "found only {} source files", files.len());
    graph(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

#[test]
fn the_crate_has_no_import_cycle() {
    let g = crate_graph();
    if let Some(c) = find_cycle(&g) {
        panic!(
            "import cycle between modules of crates/ferrocomm/src: {}\n(full graph: {g:#?})",
            c.join(" -> ")
        );
    }
}

/// The arrows docs/design.md forbids: (importer, imported, why).
const FORBIDDEN: &[(&str, &str, &str)] = &[
    ("host", "comm", "an executor never imports the communicator"),
    ("cuda", "comm", "an executor never imports the communicator"),
    ("nccl", "comm", "an executor never imports the communicator"),
    (
        "nccl",
        "cuda",
        "nccl shares the driver leaf with cuda instead",
    ),
    ("host", "cuda", "the host backend knows nothing of CUDA"),
    ("host", "nccl", "the host backend knows nothing of CUDA"),
    ("host", "driver", "the host backend knows nothing of CUDA"),
    ("plan", "comm", "the planner is pure"),
    ("plan", "backend", "the planner is pure"),
    ("plan", "host", "the planner imports no executor"),
    ("plan", "cuda", "the planner imports no executor"),
    ("plan", "nccl", "the planner imports no executor"),
    (
        "config",
        "plan",
        "configuration is ground, below the planner",
    ),
    (
        "backend",
        "comm",
        "the call description is below the communicator",
    ),
];

#[test]
fn no_forbidden_arrow() {
    let g = crate_graph();
    let broken: Vec<String> = FORBIDDEN
        .iter()
        .filter(|(from, to, _)| g.get(*from).is_some_and(|d| d.contains(*to)))
        .map(|(from, to, why)| format!("{from} imports {to}: {why}"))
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn a_cycle_is_found_and_named() {
    let files = [
        ("a.rs", "use crate::b::Thing;\n"),
        ("b/mod.rs", "pub mod inner;\n"),
        (
            "b/inner.rs",
            "use crate::{\n    c::{X, Y},\n    error::Result,\n};\n",
        ),
        (
            "c.rs",
            "fn f() { crate::a::g() } // crate::d is a comment\n",
        ),
        ("d.rs", "use crate::a;\n"),
        ("error.rs", ""),
    ];
    let g = graph(files);
    assert_eq!(
        g["b"],
        ["c", "error"].map(String::from).into(),
        "a group's items are read"
    );
    assert_eq!(
        g["c"],
        ["a"].map(String::from).into(),
        "comments are not read"
    );
    let c = find_cycle(&g).expect("a -> b -> c -> a is a cycle");
    assert_eq!(c, ["a", "b", "c", "a"]);
    // Without the arrow back, no cycle.
    let acyclic = graph(files.map(|(p, t)| (p, if p == "c.rs" { "" } else { t })));
    assert_eq!(find_cycle(&acyclic), None);
}

#[test]
fn strings_and_identifiers_are_not_imports() {
    let text = "let s = \"// not a comment\"; use crate::x; let y = mycrate::z; // crate::w\n";
    assert_eq!(imports(text), ["x"].map(String::from).into());
}

/// Every "docs/design.md, rule N" (or "rules N-M") in the crate's sources and kernels names a
/// protocol rule that docs/design.md lists: the rules the code cites are in the repository.
#[test]
fn cited_design_rules_exist() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(crate_dir.join("../../docs/design.md"))
        .expect("docs/design.md holds the rules the code cites");
    let protocol = design
        .split("## Protocol rules")
        .nth(1)
        .expect("docs/design.md has a section of protocol rules");
    let listed = protocol
        .lines()
        .filter_map(|l| l.split_once(". ").and_then(|(n, _)| n.parse::<u32>().ok()))
        .max()
        .unwrap_or(0);
    assert!(listed >= 9, "docs/design.md lists {listed} protocol rules");
    let mut files = Vec::new();
    let mut dirs = vec![crate_dir.join("src"), crate_dir.join("kernels")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    let mut cited = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for (i, _) in text.match_indices("docs/design.md, rule") {
            let rest = &text[i + "docs/design.md, rule".len()..];
            let rest = rest.trim_start_matches('s').trim_start();
            for n in rest
                .split(|c: char| !c.is_ascii_digit())
                .take_while(|s| !s.is_empty())
            {
                let n: u32 = n.parse().unwrap();
                assert!(
                    (1..=listed).contains(&n),
                    "{}: cites rule {n}, docs/design.md lists 1-{listed}",
                    f.display()
                );
                cited += 1;
            }
        }
    }
    assert!(
        cited > 0,
        "no citation of docs/design.md found: the scan is broken"
    );
}
