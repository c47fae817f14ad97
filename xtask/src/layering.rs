//! `cargo xtask layering`: checks that the leaf modules of `agent/src` stay leaves and
//! that the top-level modules use each other without cycles, and reports the import graph.
//!
//! A leaf (see [`LEAVES`] and `ARCHITECTURE.md`) may use nothing of the crate but other
//! leaves. The check reads the sources, so it needs no build: every `crate::<module>`
//! path of every file of a leaf (test code included), and every `super::` path that climbs
//! out of the leaf, must name a leaf. A violation is reported as
//! `file:line: crate::x::y` and fails the step.
//!
//! The report then lists the cycles between top-level modules as `ARCHITECTURE.md`
//! counts them: production code only (comments, `#[cfg(test)]` items and the files of
//! `#[cfg(test)] mod x;` left out), the strongly connected components of more than one
//! module, and each two-module cycle with the paths that make it. Since issue 28 item 2
//! the graph has none, and a cycle fails the step as a leaf violation does: a module that
//! needs something from a module above it takes it as a trait, a function or a settings
//! struct given to it, or the shared piece moves down (see `ARCHITECTURE.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

/// The leaf modules of `agent/src`: each may use only leaves.
pub const LEAVES: &[&str] = &["api_throttle", "config", "event_api", "events", "memory", "process_metrics", "types"];

/// One `crate::<module>` use in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    /// The line (1-based).
    pub line: usize,
    /// The top-level module it names.
    pub module: String,
    /// The path as written, from `crate` (or the `super`s) to the end of the path.
    pub path: String,
    /// Whether it is in test code (a `#[cfg(test)]` item).
    pub test: bool,
}

/// A leaf using a module that is not a leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub file: PathBuf,
    pub line: usize,
    pub leaf: String,
    pub path: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: `{}`: the leaf `{}` may use only leaves ({})",
            self.file.display(),
            self.line,
            self.path,
            self.leaf,
            LEAVES.join(", ")
        )
    }
}

/// A source file of the crate, its top-level module and its uses.
#[derive(Debug)]
pub struct SourceFile {
    /// Relative to the workspace.
    pub path: PathBuf,
    pub module: String,
    /// Whether the whole file is test code (declared by `#[cfg(test)] mod x;`).
    pub test_only: bool,
    pub uses: Vec<Use>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Punct(char),
}

/// The tokens of Rust source that matter here, with their lines: identifiers and
/// punctuation; comments, string, char and number literals and lifetimes are dropped.
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let count_lines = |s: &[u8]| s.split(|&c| c == b'\n').count() - 1;
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let (start, mut depth) = (i, 0);
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += count_lines(&b[start..i.min(b.len())]);
        } else if let Some(end) = raw_string_end(b, i) {
            line += count_lines(&b[i..end]);
            i = end;
        } else if c == b'"' || (c == b'b' && b.get(i + 1) == Some(&b'"')) {
            let start = i;
            i += if c == b'b' { 2 } else { 1 };
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            line += count_lines(&b[start..i.min(b.len())]);
        } else if c == b'\'' || (c == b'b' && b.get(i + 1) == Some(&b'\'')) {
            // A char literal ('a', '\n', '\u{1F600}', b'x') or a lifetime ('a, 'static).
            let q = if c == b'b' { i + 1 } else { i };
            match (b.get(q + 1), b.get(q + 2)) {
                (Some(b'\\'), _) => {
                    // Past the backslash and the escaped char, to the closing quote.
                    i = q + 3;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                }
                (Some(_), Some(b'\'')) => i = q + 3,
                _ => {
                    // A lifetime or a multi-byte char: skip the quote and the identifier.
                    i = q + 1;
                    if b.get(i).is_some_and(|c| !c.is_ascii()) {
                        while i < b.len() && b[i] != b'\'' {
                            i += 1;
                        }
                        i += 1;
                    } else {
                        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                            i += 1;
                        }
                    }
                }
            }
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == b'_' || !c.is_ascii() {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || !b[i].is_ascii()) {
                i += 1;
            }
            let word = String::from_utf8_lossy(&b[start..i]).into_owned();
            out.push((Tok::Ident(word.strip_prefix("r#").unwrap_or(&word).to_owned()), line));
        } else {
            out.push((Tok::Punct(c as char), line));
            i += 1;
        }
    }
    out
}

/// The end of a raw string literal (`r"..."`, `r#"..."#`, `br#"..."#`) starting at `i`.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    if b.get(j) == Some(&b'b') {
        j += 1;
    }
    if b.get(j) != Some(&b'r') || (i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    if b.get(j) != Some(&b'"') {
        return None;
    }
    j += 1;
    let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
    while j < b.len() {
        if b[j..].starts_with(&close) {
            return Some(j + close.len());
        }
        j += 1;
    }
    Some(b.len())
}

/// What [`scan`] finds in one file.
#[derive(Debug, Default, PartialEq, Eq)]
struct Scan {
    uses: Vec<Use>,
    /// Modules declared `#[cfg(test)] mod x;` (their files are test code).
    test_mods: Vec<String>,
}

fn is_ident(t: Option<&(Tok, usize)>, s: &str) -> bool {
    matches!(t, Some((Tok::Ident(w), _)) if w == s)
}

fn is_punct(t: Option<&(Tok, usize)>, c: char) -> bool {
    matches!(t, Some((Tok::Punct(p), _)) if *p == c)
}

/// `::` at `i`.
fn is_path_sep(toks: &[(Tok, usize)], i: usize) -> bool {
    is_punct(toks.get(i), ':') && is_punct(toks.get(i + 1), ':')
}

/// The path text from `i` on (identifiers joined by `::`, a `{...}` group abbreviated).
fn path_text(toks: &[(Tok, usize)], mut i: usize) -> String {
    let mut text = String::new();
    loop {
        match toks.get(i) {
            Some((Tok::Ident(w), _)) => text.push_str(w),
            Some((Tok::Punct('{'), _)) => {
                text.push_str("{..}");
                return text;
            }
            Some((Tok::Punct('*'), _)) => {
                text.push('*');
                return text;
            }
            _ => return text,
        }
        if !is_path_sep(toks, i + 1) {
            return text;
        }
        text.push_str("::");
        i += 3;
    }
}

/// The first identifier of each top-level item of the `{...}` group opening at `i`.
fn group_heads(toks: &[(Tok, usize)], i: usize) -> Vec<(String, usize)> {
    let mut heads = Vec::new();
    let (mut depth, mut expect) = (0, true);
    for (tok, line) in &toks[i..] {
        match tok {
            Tok::Punct('{') => {
                depth += 1;
                if depth == 1 {
                    expect = true;
                }
            }
            Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Tok::Punct(',') if depth == 1 => expect = true,
            Tok::Ident(w) if depth == 1 && expect => {
                heads.push((w.clone(), *line));
                expect = false;
            }
            _ if depth == 1 => expect = false,
            _ => {}
        }
    }
    heads
}

/// The `crate::` uses of a file whose module path (from the crate root) is `module_path`
/// (e.g. `["types", "quantity", "format"]`).
fn scan(src: &str, module_path: &[String]) -> Scan {
    let toks = tokenize(src);
    let mut out = Scan::default();
    let mut depth = 0usize;
    // Inline `mod x { .. }` blocks: (name, brace depth inside them).
    let mut inline_mods: Vec<(String, usize)> = Vec::new();
    // The brace depth inside a `#[cfg(test)]` item, while in one.
    let mut test_until: Option<usize> = None;
    // A `#[cfg(test)]` was just read: the next item is test code.
    let mut cfg_test_pending = false;
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    while i < toks.len() {
        let tok = &toks[i].0;
        match tok {
            Tok::Punct('#') if is_punct(toks.get(i + 1), '[') => {
                let is_cfg_test = is_ident(toks.get(i + 2), "cfg")
                    && is_punct(toks.get(i + 3), '(')
                    && is_ident(toks.get(i + 4), "test")
                    && is_punct(toks.get(i + 5), ')');
                // Skip the attribute.
                let mut d = 0;
                while i < toks.len() {
                    match toks[i].0 {
                        Tok::Punct('[') => d += 1,
                        Tok::Punct(']') => {
                            d -= 1;
                            if d == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                if is_cfg_test && test_until.is_none() {
                    cfg_test_pending = true;
                }
            }
            Tok::Punct('{') => {
                depth += 1;
                if cfg_test_pending {
                    cfg_test_pending = false;
                    test_until = Some(depth);
                }
                if let Some(name) = pending_mod.take() {
                    inline_mods.push((name, depth));
                }
            }
            Tok::Punct('}') => {
                if inline_mods.last().is_some_and(|(_, d)| *d == depth) {
                    inline_mods.pop();
                }
                if test_until == Some(depth) {
                    test_until = None;
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Punct(';') => {
                if let Some(name) = pending_mod.take()
                    && cfg_test_pending
                {
                    out.test_mods.push(name);
                }
                cfg_test_pending = false;
            }
            Tok::Ident(w) if w == "mod" => {
                if let Some((Tok::Ident(name), _)) = toks.get(i + 1) {
                    pending_mod = Some(name.clone());
                    i += 1;
                }
            }
            Tok::Ident(word) if (word == "crate" || word == "super") && is_path_sep(&toks, i + 1) => {
                let after_dollar = i > 0 && is_punct(toks.get(i - 1), '$');
                // `x::super::..` or `x::crate`: not a path from here.
                let mid_path = i > 1 && is_path_sep(&toks, i - 2);
                if !after_dollar && !mid_path {
                    let in_test = test_until.is_some() || cfg_test_pending;
                    let mut here: Vec<String> = module_path.to_vec();
                    here.extend(inline_mods.iter().map(|(n, _)| n.clone()));
                    i = crate_path(&toks, i, &here, in_test, &mut out.uses);
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Records the use made by the `crate::..` or `super::..` path starting at `start` in a
/// module at `here` (when it leaves the top-level module); returns where the path goes on.
fn crate_path(toks: &[(Tok, usize)], start: usize, here: &[String], in_test: bool, uses: &mut Vec<Use>) -> usize {
    let mut rest = here.len();
    let mut end = start;
    let from_root = if is_ident(toks.get(start), "crate") {
        end += 3;
        true
    } else {
        while is_ident(toks.get(end), "super") && is_path_sep(toks, end + 1) {
            rest = rest.saturating_sub(1);
            end += 3;
        }
        rest == 0
    };
    if from_root {
        let prefix: Vec<&str> = toks[start..end]
            .iter()
            .filter_map(|(t, _)| if let Tok::Ident(w) = t { Some(w.as_str()) } else { None })
            .collect();
        let path = format!("{}::{}", prefix.join("::"), path_text(toks, end));
        match toks.get(end) {
            Some((Tok::Ident(module), line)) => {
                uses.push(Use { line: *line, module: module.clone(), path, test: in_test });
            }
            Some((Tok::Punct('{'), _)) => {
                for (module, line) in group_heads(toks, end) {
                    if module != "self" {
                        uses.push(Use { line, module, path: path.clone(), test: in_test });
                    }
                }
            }
            _ => {}
        }
    }
    end.max(start + 1)
}

/// The module path of a file under `agent/src` (`types/quantity/mod.rs` ->
/// `types::quantity`, `memory.rs` -> `memory`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        let stem = last.strip_suffix(".rs").unwrap_or(&last).to_owned();
        if stem != "mod" && stem != "lib" && stem != "main" {
            parts.push(stem);
        }
    }
    parts
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    entries.sort_by_key(std::fs::DirEntry::path);
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            rs_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads every file of the crate at `src` (`agent/src`), except `lib.rs` and `main.rs`.
///
/// # Errors
/// When a file cannot be read.
pub fn read_sources(workspace: &Path, src: &Path) -> Result<Vec<SourceFile>> {
    let mut paths = Vec::new();
    rs_files(src, &mut paths)?;
    let mut files = Vec::new();
    let mut test_only: BTreeSet<PathBuf> = BTreeSet::new();
    for path in &paths {
        let rel = path.strip_prefix(src).unwrap_or(path);
        if rel == Path::new("lib.rs") || rel == Path::new("main.rs") {
            continue;
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mpath = module_path(rel);
        let scan = scan(&text, &mpath);
        // The files of `#[cfg(test)] mod x;`: next to a `mod.rs`, or in a directory named
        // after a `foo.rs`.
        let dir = if rel.file_name().is_some_and(|n| n == "mod.rs") {
            path.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            path.with_extension("")
        };
        for m in &scan.test_mods {
            test_only.insert(dir.join(format!("{m}.rs")));
            test_only.insert(dir.join(m));
        }
        files.push(SourceFile {
            path: path.strip_prefix(workspace).unwrap_or(path).to_path_buf(),
            module: mpath.first().cloned().unwrap_or_default(),
            test_only: false,
            uses: scan.uses,
        });
    }
    for file in &mut files {
        let abs = workspace.join(&file.path);
        file.test_only = test_only.iter().any(|t| abs == *t || abs.starts_with(t));
    }
    Ok(files)
}

/// Every use, by a leaf, of a module that is not a leaf (test code included).
#[must_use]
pub fn leaf_violations(files: &[SourceFile], leaves: &[&str]) -> Vec<Violation> {
    let mut out = Vec::new();
    for file in files.iter().filter(|f| leaves.contains(&f.module.as_str())) {
        for u in &file.uses {
            if u.module != file.module && !leaves.contains(&u.module.as_str()) {
                out.push(Violation {
                    file: file.path.clone(),
                    line: u.line,
                    leaf: file.module.clone(),
                    path: u.path.clone(),
                });
            }
        }
    }
    out
}

/// The production import graph: module -> module -> the paths that make the edge.
pub type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The graph between top-level modules, from production code only.
#[must_use]
pub fn graph(files: &[SourceFile]) -> Graph {
    let modules: BTreeSet<&str> = files.iter().map(|f| f.module.as_str()).collect();
    let mut g = Graph::new();
    for file in files {
        g.entry(file.module.clone()).or_default();
        if file.test_only {
            continue;
        }
        for u in file.uses.iter().filter(|u| !u.test) {
            if u.module != file.module && modules.contains(u.module.as_str()) {
                g.entry(file.module.clone()).or_default().entry(u.module.clone()).or_default().insert(u.path.clone());
            }
        }
    }
    g
}

/// Strongly connected components of more than one module (Tarjan), each sorted.
#[must_use]
pub fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.g.get(v).into_iter().flat_map(BTreeMap::keys) {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    comp.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    t.out
}

/// The two-module cycles `a <-> b` (`a < b`).
#[must_use]
pub fn pairs(g: &Graph) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (a, outs) in g {
        for b in outs.keys() {
            if a < b && g.get(b).is_some_and(|o| o.contains_key(a)) {
                out.push((a.clone(), b.clone()));
            }
        }
    }
    out
}

/// The three-module cycles `a -> b -> c -> a` with no two-module cycle among them, each
/// once (starting from its smallest module).
#[must_use]
pub fn triangles(g: &Graph) -> Vec<[String; 3]> {
    let edge = |a: &str, b: &str| g.get(a).is_some_and(|o| o.contains_key(b));
    let pair = |a: &str, b: &str| edge(a, b) && edge(b, a);
    let mut out = Vec::new();
    for a in g.keys() {
        for b in g[a].keys().filter(|b| *b > a) {
            for c in g.get(b).into_iter().flat_map(BTreeMap::keys).filter(|c| *c > a && *c != b) {
                if edge(c, a) && !pair(a, b) && !pair(b, c) && !pair(c, a) {
                    out.push([a.clone(), b.clone(), c.clone()]);
                }
            }
        }
    }
    out
}

/// The report of the graph: its components and two-module cycles.
#[must_use]
pub fn report(g: &Graph) -> String {
    let mut s = String::new();
    let comps = cycles(g);
    let in_cycles: BTreeSet<&String> = comps.iter().flatten().collect();
    let _ = writeln!(s, "top-level modules: {}; in cycles: {}", g.len(), in_cycles.len());
    for comp in &comps {
        let _ = writeln!(s, "  cycle of {}: {}", comp.len(), comp.join(", "));
    }
    let free: Vec<&String> = g.keys().filter(|m| !in_cycles.contains(m)).collect();
    let _ = writeln!(s, "  in no cycle: {}", free.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", "));
    let leaves: Vec<&String> = g.iter().filter(|(_, o)| o.is_empty()).map(|(m, _)| m).collect();
    let _ =
        writeln!(s, "  using no other module: {}", leaves.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", "));
    let pairs = pairs(g);
    let _ = writeln!(s, "two-module cycles: {}", pairs.len());
    let few = |set: &BTreeSet<String>| {
        let v: Vec<&str> = set.iter().map(String::as_str).take(3).collect();
        let more = if set.len() > 3 { format!(" (+{})", set.len() - 3) } else { String::new() };
        format!("{}{more}", v.join(", "))
    };
    for (a, b) in &pairs {
        let _ = writeln!(s, "  {a} <-> {b}");
        let _ = writeln!(s, "    {a} -> {b}: {}", few(&g[a][b]));
        let _ = writeln!(s, "    {b} -> {a}: {}", few(&g[b][a]));
    }
    let triangles = triangles(g);
    let _ = writeln!(s, "three-module cycles with no two-module cycle inside: {}", triangles.len());
    for [a, b, c] in &triangles {
        let _ = writeln!(s, "  {a} -> {b} -> {c} -> {a}");
    }
    s
}

/// The check on the workspace: fails on a leaf violation or a cycle; prints the graph
/// report.
///
/// # Errors
/// When a leaf uses a module that is not a leaf, a leaf is missing, top-level modules
/// use each other in a cycle, or a file cannot be read.
pub fn run(workspace: &Path) -> Result<()> {
    let src = workspace.join("agent/src");
    let files = read_sources(workspace, &src)?;
    let started = std::time::Instant::now();
    for leaf in LEAVES {
        if !files.iter().any(|f| f.module == *leaf) {
            bail!("leaf module `{leaf}` not found under {} (update xtask/src/layering.rs LEAVES)", src.display());
        }
    }
    let violations = leaf_violations(&files, LEAVES);
    let g = graph(&files);
    print!("{}", report(&g));
    println!(
        "leaves ({}): {} files, {} violations ({} ms)",
        LEAVES.join(", "),
        files.iter().filter(|f| LEAVES.contains(&f.module.as_str())).count(),
        violations.len(),
        started.elapsed().as_millis()
    );
    for v in &violations {
        println!("{v}");
    }
    if !violations.is_empty() {
        bail!("{} uses of non-leaf modules in leaves (first: {})", violations.len(), violations[0]);
    }
    if let Some(cycle) = cycles(&g).first() {
        bail!(
            "top-level modules of agent/src use each other in a cycle: {} (the paths are listed above)",
            cycle.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mp(s: &str) -> Vec<String> {
        s.split("::").filter(|p| !p.is_empty()).map(str::to_owned).collect()
    }

    fn uses(src: &str, module: &str) -> Vec<(usize, String, bool)> {
        scan(src, &mp(module)).uses.into_iter().map(|u| (u.line, u.module, u.test)).collect()
    }

    #[test]
    fn finds_paths_and_groups() {
        let src =
            "use crate::cm::quantity;\nuse crate::{config::Config, events, self};\nfn f() { crate::pleg::x(); }\n";
        assert_eq!(
            uses(src, "types::pod"),
            vec![
                (1, "cm".into(), false),
                (2, "config".into(), false),
                (2, "events".into(), false),
                (3, "pleg".into(), false)
            ]
        );
        let s = scan("use crate::{cm::{a, b}, x};", &mp("types"));
        assert_eq!(s.uses[0].path, "crate::{..}");
        assert_eq!(s.uses.iter().map(|u| u.module.as_str()).collect::<Vec<_>>(), ["cm", "x"]);
    }

    #[test]
    fn ignores_comments_strings_and_macro_crate() {
        let src = r##"
// use crate::cm;
/* crate::cm /* nested crate::pleg */ crate::sources */
/// [`crate::runtime`]
const A: &str = "crate::cm \" crate::pleg";
const B: &str = r#"crate::cm "# ;
const C: char = '"';
fn f<'a>(x: &'a str) -> char { let _ = b'\''; 'x' }
macro_rules! m { () => { $crate::events::x() } }
use crate::types::pod;
"##;
        assert_eq!(uses(src, "types"), vec![(10, "types".into(), false)]);
    }

    #[test]
    fn marks_test_code() {
        let src = "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n    fn f() { crate::c::d(); }\n}\nuse crate::e;\n#[cfg(test)]\nuse crate::f;\n#[cfg(test)]\nmod more;\n";
        let s = scan(src, &mp("types"));
        let got: Vec<(&str, bool)> = s.uses.iter().map(|u| (u.module.as_str(), u.test)).collect();
        assert_eq!(got, [("a", false), ("b", true), ("c", true), ("e", false), ("f", true)]);
        assert_eq!(s.test_mods, ["more"]);
    }

    #[test]
    fn super_paths_that_leave_the_module() {
        // From `types/pod.rs`, `super::` is `types`; `super::super::` is the crate root.
        assert_eq!(
            uses("use super::quantity;\nuse super::super::cm::x;\n", "types::pod"),
            vec![(2, "cm".into(), false)]
        );
        // From a top-level file, `super::` is the crate root; in its inline `mod tests`,
        // `super::` is the file's module.
        let src = "use super::cm;\nmod tests { use super::*; use super::super::pleg; }\n";
        assert_eq!(uses(src, "memory"), vec![(1, "cm".into(), false), (2, "pleg".into(), false)]);
    }

    #[test]
    fn violations_name_file_line_and_path() {
        let files = vec![
            SourceFile {
                path: "agent/src/types/pod.rs".into(),
                module: "types".into(),
                test_only: false,
                uses: vec![
                    Use { line: 3, module: "types".into(), path: "crate::types::quantity".into(), test: false },
                    Use { line: 4, module: "events".into(), path: "crate::events::x".into(), test: false },
                    Use { line: 9, module: "cm".into(), path: "crate::cm::qos".into(), test: true },
                ],
            },
            SourceFile {
                path: "agent/src/cm/mod.rs".into(),
                module: "cm".into(),
                test_only: false,
                uses: vec![Use { line: 1, module: "runtime".into(), path: "crate::runtime".into(), test: false }],
            },
        ];
        let v = leaf_violations(&files, &["types", "events"]);
        assert_eq!(v.len(), 1);
        assert!(
            v[0].to_string().starts_with("agent/src/types/pod.rs:9: `crate::cm::qos`: the leaf `types`"),
            "{}",
            v[0]
        );
    }

    #[test]
    fn cycles_and_pairs() {
        let mut g = Graph::new();
        let mut edge = |a: &str, b: &str| {
            g.entry(a.into()).or_default().entry(b.into()).or_default().insert(format!("crate::{b}"));
            g.entry(b.into()).or_default();
        };
        edge("a", "b");
        edge("b", "a");
        edge("b", "c");
        edge("c", "d");
        edge("d", "b");
        edge("e", "a");
        edge("x", "y");
        edge("y", "z");
        edge("z", "x");
        assert_eq!(triangles(&g), vec![["b".to_owned(), "c".into(), "d".into()], ["x".into(), "y".into(), "z".into()]]);
        assert_eq!(
            cycles(&g),
            vec![vec!["a".to_owned(), "b".into(), "c".into(), "d".into()], vec!["x".into(), "y".into(), "z".into()]]
        );
        assert_eq!(pairs(&g), vec![("a".to_owned(), "b".to_owned())]);
        let r = report(&g);
        assert!(r.contains("cycle of 4: a, b, c, d"), "{r}");
        assert!(r.contains("in no cycle: e"), "{r}");
        assert!(r.contains("  x -> y -> z -> x"), "{r}");
    }

    /// The check on this workspace's sources: what CI runs.
    #[test]
    fn the_leaves_of_this_workspace_stay_leaves() {
        let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap();
        let files = read_sources(&workspace, &workspace.join("agent/src")).unwrap();
        for leaf in LEAVES {
            assert!(files.iter().any(|f| f.module == *leaf), "leaf {leaf} not found");
        }
        let violations = leaf_violations(&files, LEAVES);
        assert!(violations.is_empty(), "{}", violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
    }

    /// No cycles between the top-level modules of this workspace: what CI runs.
    #[test]
    fn the_top_level_modules_of_this_workspace_have_no_cycle() {
        let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap();
        let g = graph(&read_sources(&workspace, &workspace.join("agent/src")).unwrap());
        assert!(cycles(&g).is_empty(), "{}", report(&g));
    }
}
