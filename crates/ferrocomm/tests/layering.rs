//! The crate's layering, held by `cargo test` (docs/design.md, "Layers" and its rules): no
//! import cycle between the top-level modules of `crates/ferrocomm/src`, none of the arrows the
//! design forbids, none between the parts of the cuda backend (`cuda/`: its backend, `dda/`,
//! the kernel registry, NVML), and the CUDA driver's raw declarations (`cudarc::driver::sys`)
//! named in `driver/` alone (in this crate, the command-line tool and the Python extension).
//!
//! A module is a file at `src/` or a folder under it; it imports another when its source names
//! `crate::other` (in a `use` or a path, `use crate::{a, b}` groups included). Comments are not
//! read. `lib.rs`, which declares every module, is left out. Inside `cuda/`, paths through
//! `super::` and to child modules count too.

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

/// The arrows the design forbids (docs/design.md, rule "arrows point down"): (importer,
/// imported, why).
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
    ("driver", "backend", "the driver layer imports no backend"),
    ("driver", "cuda", "the driver layer imports no backend"),
    ("driver", "nccl", "the driver layer imports no backend"),
    ("driver", "host", "the driver layer imports no backend"),
    ("driver", "comm", "the driver layer imports no backend"),
    ("driver", "plan", "the driver layer imports no backend"),
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

/// The text of a source without its comments and without its inline test module (whose
/// `super::` means the file's own module).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(strip_comment)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module path of a source file under `src/` (`cuda/dda/lowp.rs` is `cuda::dda::lowp`,
/// `cuda/dda/mod.rs` is `cuda::dda`).
fn module_path(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Every path a source text names, resolved to an absolute module path from the crate root:
/// `crate::a::b`, `super::x` (from the module at `at`), `self::x` and `child::x` for the
/// modules the file declares (`mod child;`); a `{...}` group gives one path per item.
fn resolved_paths(at: &[String], text: &str) -> Vec<Vec<String>> {
    let code = code_of(text);
    let children: Vec<String> = code
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub(super) "))
                .unwrap_or(l);
            l.strip_prefix("mod ")
                .and_then(|r| r.strip_suffix(';'))
                .map(|m| m.trim().to_string())
        })
        .collect();
    let bytes = code.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        // The start of an identifier (not the middle of one, not after `::`).
        if !is_ident(bytes[i]) || (i > 0 && is_ident(bytes[i - 1])) {
            i += 1;
            continue;
        }
        let after_colons = i >= 2 && &code[i - 2..i] == "::";
        // `pub(in crate::cuda)` names who may see an item, not an import.
        let visibility = code[..i].trim_end().ends_with("(in");
        let (segs, end) = path_at(&code, i);
        i = end.max(i + 1);
        if after_colons || visibility || segs.len() < 2 {
            continue;
        }
        let mut base: Vec<String> = match segs[0].as_str() {
            "crate" => Vec::new(),
            "self" => at.to_vec(),
            "super" => at.to_vec(),
            c if children.iter().any(|m| m == c) => at.to_vec(),
            _ => continue,
        };
        let mut rest = &segs[..];
        if rest[0] == "crate" || rest[0] == "self" {
            rest = &rest[1..];
        }
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        for group_item in expand_group(rest) {
            let mut p = base.clone();
            p.extend(group_item);
            out.push(p);
        }
    }
    out
}

/// The path segments starting at byte `i` of `code` (`a::b::{c, d::e}` gives `a`, `b`, and a
/// last segment `{c, d::e}` holding the group), and where it ends.
fn path_at(code: &str, mut i: usize) -> (Vec<String>, usize) {
    let bytes = code.as_bytes();
    let mut segs = Vec::new();
    loop {
        if bytes.get(i) == Some(&b'{') {
            let mut depth = 0;
            let start = i;
            while i < bytes.len() {
                match bytes[i] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            segs.push(code[start..i].to_string());
            return (segs, i);
        }
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        if i == start {
            return (segs, i);
        }
        segs.push(code[start..i].to_string());
        let ws = code[i..].len() - code[i..].trim_start().len();
        if code[i + ws..].starts_with("::") {
            i += ws + 2;
            i += code[i..].len() - code[i..].trim_start().len();
        } else {
            return (segs, i);
        }
    }
}

/// A path's segments with a trailing `{...}` group expanded into one path per item (each item's
/// first segment is enough to name the module it comes from).
fn expand_group(segs: &[String]) -> Vec<Vec<String>> {
    match segs.last() {
        Some(last) if last.starts_with('{') => {
            let prefix = &segs[..segs.len() - 1];
            let mut items = Vec::new();
            let inner = &last[1..last.len() - 1];
            let mut depth = 0usize;
            let mut item_start = 0;
            for (k, c) in inner.char_indices().chain([(inner.len(), ',')]) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        let item = inner[item_start..k].trim();
                        item_start = k + 1;
                        if let Some(id) = ident(item) {
                            let mut p = prefix.to_vec();
                            p.push(id.to_string());
                            items.push(p);
                        }
                    }
                    _ => {}
                }
            }
            items
        }
        _ => vec![segs.to_vec()],
    }
}

/// The import graph of the parts of the cuda backend: the modules under `src/cuda/` (a folder
/// is one part) and `cuda` itself (its `mod.rs`, for the items it defines).
fn cuda_graph(files: &[(String, String)]) -> Graph {
    cuda_graph_with_paths(files).0
}

/// [`cuda_graph`], and for each arrow one path that makes it (file: path), for messages.
fn cuda_graph_with_paths(
    files: &[(String, String)],
) -> (Graph, BTreeMap<(String, String), String>) {
    let mut why = BTreeMap::new();
    let parts: BTreeSet<String> = files
        .iter()
        .filter_map(|(p, _)| p.strip_prefix("cuda/"))
        .filter(|p| *p != "mod.rs")
        .map(|p| {
            p.split('/')
                .next()
                .unwrap_or(p)
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    let mut g = Graph::new();
    for (file, text) in files.iter().filter(|(p, _)| p.starts_with("cuda/")) {
        let at = module_path(file);
        let from = at.get(1).cloned().unwrap_or_else(|| "cuda".into());
        let entry = g.entry(from.clone()).or_default();
        for p in resolved_paths(&at, text) {
            if p.first().map(String::as_str) != Some("cuda") {
                continue;
            }
            let to = match p.get(1) {
                Some(part) if parts.contains(part) => part.clone(),
                _ => "cuda".into(),
            };
            if to != from {
                why.entry((from.clone(), to.clone()))
                    .or_insert_with(|| format!("{file}: {}", p.join("::")));
                entry.insert(to);
            }
        }
    }
    (g, why)
}

fn crate_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    files
}

#[test]
fn the_parts_of_the_cuda_backend_import_no_circle() {
    let (g, why) = cuda_graph_with_paths(&crate_files());
    assert!(g.contains_key("dda") && g.contains_key("backend"), "{g:#?}");
    if let Some(c) = find_cycle(&g) {
        let arrows: Vec<&String> = c
            .windows(2)
            .filter_map(|w| why.get(&(w[0].clone(), w[1].clone())))
            .collect();
        panic!(
            "import cycle between the parts of cuda/: {} ({arrows:?})\n(full graph: {g:#?})",
            c.join(" -> ")
        );
    }
    // Direct access sits below the backend and the module that declares it: it imports the
    // kernel registry and NVML, never back up.
    let up: Vec<&String> = g["dda"]
        .iter()
        .filter(|m| *m != "kernels" && *m != "nvml")
        .filter_map(|m| why.get(&("dda".to_string(), m.clone())))
        .collect();
    assert!(
        up.is_empty(),
        "dda imports {up:?}: only kernels and nvml are below it"
    );
    assert!(g["backend"].contains("dda"), "{g:#?}");
}

/// The lines of `files` that name the driver's raw declarations (`cudarc::driver::sys`), as
/// `crate/file:line: text`.
fn raw_driver_lines(krate: &str, files: &[(String, String)]) -> Vec<String> {
    let mut named = Vec::new();
    for (file, text) in files {
        let code = code_of(text);
        for (k, line) in code.lines().enumerate() {
            let raw = line.contains("driver::sys")
                || (line.contains("cudarc::driver::{") && line.contains("sys"));
            if raw {
                named.push(format!("{krate}/{file}:{}: {}", k + 1, line.trim()));
            }
        }
    }
    named
}

/// The raw declarations are named in ferrocomm's `src/driver/` alone: not in the rest of the
/// library, nor in the command-line tool or the Python extension, which call the driver through
/// `ferrocomm::driver` (the GPU check programs under `examples/` test the driver itself and may
/// name it).
#[test]
fn the_raw_driver_declarations_are_named_in_driver_alone() {
    let lib: Vec<(String, String)> = crate_files()
        .into_iter()
        .filter(|(f, _)| !f.starts_with("driver/"))
        .collect();
    let mut named = raw_driver_lines("ferrocomm/src", &lib);
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for other in ["ferrocomm-cli", "ferrocomm-py"] {
        let root = crates.join(other).join("src");
        let mut files = Vec::new();
        sources(&root, &root, &mut files);
        assert!(!files.is_empty(), "no sources under {}", root.display());
        named.extend(raw_driver_lines(&format!("{other}/src"), &files));
    }
    assert!(
        named.is_empty(),
        "cudarc::driver::sys outside ferrocomm's src/driver/ (call the driver through \
         ferrocomm::driver):\n{}",
        named.join("\n")
    );
}

#[test]
fn a_raw_driver_line_is_found() {
    let files = [(
        "bench/gpu.rs".to_string(),
        "use cudarc::driver::{result, sys};\n// cudarc::driver::sys in a comment\n\
         let p: cudarc::driver::sys::CUdeviceptr = 0;\nuse ferrocomm::driver::EventFlags;\n"
            .to_string(),
    )];
    assert_eq!(
        raw_driver_lines("cli", &files),
        [
            "cli/bench/gpu.rs:1: use cudarc::driver::{result, sys};",
            "cli/bench/gpu.rs:3: let p: cudarc::driver::sys::CUdeviceptr = 0;",
        ]
    );
}

#[test]
fn paths_through_super_groups_and_children_are_resolved() {
    let at = module_path("cuda/dda/lowp.rs");
    assert_eq!(at, ["cuda", "dda", "lowp"]);
    let text = "use super::{Args, collectives::x};\nuse super::super::kernels;\n\
                use crate::cuda::{nvml, kernels::y};\nfn f() { crate::driver::launch(); }\n\
                pub(in crate::cuda) fn g() {}\n\
                // crate::cuda::backend in a comment\n\
                #[cfg(test)]\nmod tests {\n    use super::*;\n}\n";
    let paths: BTreeSet<String> = resolved_paths(&at, text)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    let want: BTreeSet<String> = [
        "cuda::dda::Args",
        "cuda::dda::collectives",
        "cuda::kernels",
        "cuda::nvml",
        "cuda::kernels",
        "driver::launch",
    ]
    .map(String::from)
    .into();
    assert_eq!(paths, want);
    // A child module named without a prefix, as in the `mod.rs` that declares it.
    let root = module_path("cuda/mod.rs");
    let paths = resolved_paths(
        &root,
        "mod dda;\npub use dda::{a, b};\nfn g() { dda::c(); }\n",
    );
    assert!(paths.iter().all(|p| p[..2] == ["cuda", "dda"]), "{paths:?}");
    assert_eq!(paths.len(), 3);
    // A cycle among the parts is found.
    let files = [
        (
            "cuda/mod.rs".to_string(),
            "mod backend;\nmod dda;\n".to_string(),
        ),
        (
            "cuda/backend.rs".to_string(),
            "use super::dda::Dda;\n".to_string(),
        ),
        (
            "cuda/dda/mod.rs".to_string(),
            "use crate::cuda::backend::X;\n".to_string(),
        ),
    ];
    let g = cuda_graph(&files);
    assert_eq!(
        find_cycle(&g).expect("backend -> dda -> backend"),
        ["backend", "dda", "backend"]
    );
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
