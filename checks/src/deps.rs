//! The module dependency rules of `ARCHITECTURE.md`, checked against the
//! `use crate::`/`use super::` imports (and `crate::`/`super::` paths in code
//! and macro bodies) of the `tenure` crate in `framework/src/`.
//!
//! - [`load_crate`] follows `mod` declarations from `lib.rs`, so a file that is
//!   not a module (a guide's example) is not read.
//! - [`Index`] knows each module's children, items and imports, and resolves a
//!   path through re-exports to the file that defines the item: `crate::JobId`
//!   is an edge to `types`, not to the crate root.
//! - [`parse_rules`] reads the table between `<!-- dependency-rules:begin -->`
//!   and `<!-- dependency-rules:end -->` in `ARCHITECTURE.md`.
//! - [`check`] reports each edge a rule forbids, and each file-level import
//!   cycle (files that import from one another, a module file and its own
//!   submodules' files excepted: a parent composes its children and a child
//!   reads its parent's items, that is how a Rust module is built).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

use crate::item_attrs;

/// A module path from the crate root, `["blocks", "fence", "row"]`.
pub type ModPath = Vec<String>;

/// One source file of the crate.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Path relative to the crate's `src/`, with `/` separators.
    pub path: String,
    /// The module this file is (`[]` for `lib.rs`).
    pub module: ModPath,
    /// The file's text.
    pub text: String,
}

/// Reads the crate's files from `src_dir`, starting at `lib.rs` and following
/// every `mod name;` declaration (inline modules included).
pub fn load_crate(src_dir: &Path) -> Result<Vec<SourceFile>, String> {
    let mut out = Vec::new();
    let mut todo: Vec<(String, ModPath, bool)> = vec![("lib.rs".into(), vec![], true)];
    while let Some((rel, module, owns_dir)) = todo.pop() {
        let full = src_dir.join(&rel);
        let text =
            std::fs::read_to_string(&full).map_err(|e| format!("{}: {e}", full.display()))?;
        let file = syn::parse_file(&text).map_err(|e| format!("{rel}: {e}"))?;
        // The directory this file's child modules live in.
        let dir = if owns_dir {
            match rel.rfind('/') {
                Some(i) => rel[..i + 1].to_string(),
                None => String::new(),
            }
        } else {
            format!("{}/", rel.trim_end_matches(".rs"))
        };
        let mut decls = Vec::new();
        external_mods(&file.items, &dir, &module, &mut decls);
        for (child_dir, child_mod, name) in decls {
            let flat = format!("{child_dir}{name}.rs");
            let nested = format!("{child_dir}{name}/mod.rs");
            if src_dir.join(&flat).is_file() {
                todo.push((flat, child_mod, false));
            } else if src_dir.join(&nested).is_file() {
                todo.push((nested, child_mod, true));
            } else {
                return Err(format!("{rel}: no file for `mod {name};`"));
            }
        }
        out.push(SourceFile {
            path: rel,
            module,
            text,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// `mod name;` declarations in `items` (and in inline modules, whose files
/// live one directory further down): (directory, module path, name).
fn external_mods(
    items: &[syn::Item],
    dir: &str,
    module: &ModPath,
    out: &mut Vec<(String, ModPath, String)>,
) {
    for item in items {
        if let syn::Item::Mod(m) = item {
            let name = m.ident.to_string();
            let mut child = module.clone();
            child.push(name.clone());
            match &m.content {
                None => out.push((dir.to_string(), child, name)),
                Some((_, inner)) => external_mods(inner, &format!("{dir}{name}/"), &child, out),
            }
        }
    }
}

/// One `use` leaf: the name it brings in (`None` for a glob) and the path as
/// written.
#[derive(Debug, Clone)]
struct UseLeaf {
    name: Option<String>,
    path: Vec<String>,
    line: usize,
}

#[derive(Debug, Default)]
struct Module {
    file: usize,
    children: BTreeSet<String>,
    items: BTreeSet<String>,
    imports: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
}

/// Where a path leads: the module that defines the item (or the module the
/// path names) and that module's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub module: ModPath,
    pub file: usize,
}

/// Every module of the crate: its file, children, items and imports.
#[derive(Debug)]
pub struct Index {
    modules: BTreeMap<ModPath, Module>,
}

impl Index {
    /// Indexes the parsed files (same order as `files`).
    fn new(files: &[SourceFile], parsed: &[syn::File]) -> Index {
        let mut modules = BTreeMap::new();
        for (i, (f, p)) in files.iter().zip(parsed).enumerate() {
            index_items(&p.items, &f.module, i, &mut modules);
        }
        Index { modules }
    }

    /// `segs` as written in module `at`, made absolute; `None` if it leaves
    /// the crate (another crate, the prelude, a generic parameter).
    fn absolute(&self, at: &[String], segs: &[String]) -> Option<Vec<String>> {
        let first = segs.first()?;
        let (mut base, mut rest): (Vec<String>, &[String]) = match first.as_str() {
            "crate" | "$crate" => (vec![], &segs[1..]),
            "self" => (at.to_vec(), &segs[1..]),
            "super" => (at.to_vec(), segs),
            name => {
                let m = self.modules.get(at)?;
                if m.children.contains(name)
                    || m.items.contains(name)
                    || m.imports.contains_key(name)
                {
                    (at.to_vec(), segs)
                } else {
                    return None;
                }
            }
        };
        while rest.first().map(String::as_str) == Some("super") {
            base.pop()?;
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// Follows an absolute path through modules and imports to the item it
    /// names. `None` if it leads out of the crate.
    pub fn resolve(&self, path: &[String]) -> Option<Target> {
        self.resolve_depth(path, 0)
    }

    fn resolve_depth(&self, path: &[String], depth: usize) -> Option<Target> {
        if depth > 32 {
            return None;
        }
        let mut at: ModPath = vec![];
        for (i, seg) in path.iter().enumerate() {
            let m = self.modules.get(&at)?;
            let here = || Target {
                module: at.clone(),
                file: m.file,
            };
            // A module and a function may share a name (`mod setup;` and
            // `fn setup`): a path's last segment names the item.
            let last = i + 1 == path.len();
            if m.children.contains(seg) && !(last && m.items.contains(seg)) {
                at.push(seg.clone());
                continue;
            }
            if m.items.contains(seg) {
                return Some(here());
            }
            if let Some(written) = m.imports.get(seg) {
                let mut next = self.absolute(&at, written)?;
                next.extend(path[i + 1..].iter().cloned());
                return self.resolve_depth(&next, depth + 1);
            }
            for glob in &m.globs {
                if let Some(mut next) = self.absolute(&at, glob) {
                    next.extend(path[i..].iter().cloned());
                    if let Some(t) = self.resolve_depth(&next, depth + 1) {
                        return Some(t);
                    }
                }
            }
            // Not found (a derive's or macro's name, say): the module reached.
            return Some(here());
        }
        let m = self.modules.get(&at)?;
        Some(Target {
            module: at,
            file: m.file,
        })
    }
}

fn index_items(
    items: &[syn::Item],
    module: &ModPath,
    file: usize,
    modules: &mut BTreeMap<ModPath, Module>,
) {
    let entry = modules.entry(module.clone()).or_default();
    entry.file = file;
    for item in items {
        let name = match item {
            syn::Item::Const(i) => Some(i.ident.to_string()),
            syn::Item::Enum(i) => Some(i.ident.to_string()),
            syn::Item::Fn(i) => Some(i.sig.ident.to_string()),
            syn::Item::Static(i) => Some(i.ident.to_string()),
            syn::Item::Struct(i) => Some(i.ident.to_string()),
            syn::Item::Trait(i) => Some(i.ident.to_string()),
            syn::Item::TraitAlias(i) => Some(i.ident.to_string()),
            syn::Item::Type(i) => Some(i.ident.to_string()),
            syn::Item::Union(i) => Some(i.ident.to_string()),
            syn::Item::Macro(i) => i.ident.as_ref().map(|i| i.to_string()),
            _ => None,
        };
        let entry = modules.entry(module.clone()).or_default();
        if let Some(n) = name {
            entry.items.insert(n);
        }
        match item {
            syn::Item::Use(u) => {
                let mut leaves = Vec::new();
                use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
                for leaf in leaves {
                    match leaf.name {
                        Some(n) if n != "_" => {
                            entry.imports.insert(n, leaf.path);
                        }
                        Some(_) => {}
                        None => entry.globs.push(leaf.path),
                    }
                }
            }
            syn::Item::Mod(m) => {
                let name = m.ident.to_string();
                entry.children.insert(name.clone());
                let mut child = module.clone();
                child.push(name);
                match &m.content {
                    Some((_, inner)) => index_items(inner, &child, file, modules),
                    // The file's own pass fills it in.
                    None => {
                        modules.entry(child).or_default();
                    }
                }
            }
            _ => {}
        }
    }
}

fn use_leaves(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix.clone();
            // `use a::b::{self}` names `b`.
            let name = if name == "self" {
                prefix.last().cloned().unwrap_or(name)
            } else {
                path.push(name.clone());
                name
            };
            out.push(UseLeaf {
                name: Some(name),
                path,
                line: n.ident.span().start().line,
            });
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push(UseLeaf {
                name: Some(r.rename.to_string()),
                path,
                line: r.ident.span().start().line,
            });
        }
        syn::UseTree::Glob(g) => out.push(UseLeaf {
            name: None,
            path: prefix.clone(),
            line: g.star_token.span.start().line,
        }),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_leaves(t, prefix, out);
            }
        }
    }
}

/// One reference from a file to an item of the crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Index of the referring file.
    pub file: usize,
    pub line: usize,
    /// The module the reference is written in (inline modules included).
    pub from: ModPath,
    /// The path as written, `crate::fence::FenceStore`.
    pub written: String,
    pub to: Target,
}

/// Every `use` of the crate's own items, and every `crate::`/`super::`/
/// `self::` path in code and in macro bodies, resolved. Items under
/// `#[cfg(test)]` are left out: a unit test may build its inputs with any
/// module.
pub fn references(files: &[SourceFile]) -> Result<(Index, Vec<Reference>), String> {
    let parsed = files
        .iter()
        .map(|f| syn::parse_file(&f.text).map_err(|e| format!("{}: {e}", f.path)))
        .collect::<Result<Vec<_>, _>>()?;
    let index = Index::new(files, &parsed);
    let mut refs = Vec::new();
    for (i, (f, p)) in files.iter().zip(&parsed).enumerate() {
        let mut v = Collector {
            index: &index,
            file: i,
            module: f.module.clone(),
            out: &mut refs,
        };
        v.visit_file(p);
    }
    Ok((index, refs))
}

struct Collector<'a> {
    index: &'a Index,
    file: usize,
    module: ModPath,
    out: &'a mut Vec<Reference>,
}

impl Collector<'_> {
    fn record(&mut self, segs: &[String], line: usize) {
        let Some(abs) = self.index.absolute(&self.module, segs) else {
            return;
        };
        let Some(to) = self.index.resolve(&abs) else {
            return;
        };
        self.out.push(Reference {
            file: self.file,
            line,
            from: self.module.clone(),
            written: segs.join("::"),
            to,
        });
    }

    /// `crate :: a :: b` (or `$crate`, `super`, `self`) in a macro's tokens.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => {
                    self.scan_tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(id) if is_path_start(&id.to_string()) => {
                    let dollar =
                        i > 0 && matches!(&trees[i - 1], TokenTree::Punct(p) if p.as_char() == '$');
                    let mut segs = vec![if dollar && id == "crate" {
                        "$crate".to_string()
                    } else {
                        id.to_string()
                    }];
                    let line = id.span().start().line;
                    let mut j = i + 1;
                    while j + 2 < trees.len() + 1 {
                        let colons = matches!(
                            (&trees.get(j), &trees.get(j + 1)),
                            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                                if a.as_char() == ':' && b.as_char() == ':'
                        );
                        match (colons, trees.get(j + 2)) {
                            (true, Some(TokenTree::Ident(next))) => {
                                segs.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if segs.len() > 1 {
                        self.record(&segs, line);
                    }
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

fn is_path_start(s: &str) -> bool {
    matches!(s, "crate" | "super" | "self")
}

/// `#[cfg(test)]`: unit tests may build their inputs with any module.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string() == "test")
    })
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.module.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.module.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut leaves = Vec::new();
        use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
        for leaf in leaves {
            // A path of one segment (`use fence;` in a 2018 crate names an
            // external crate or a child; `use self;` is not Rust) is skipped.
            if leaf.path.len() > 1 || leaf.name.is_none() {
                self.record(&leaf.path, leaf.line);
            }
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() && p.segments.len() > 1 {
            let first = p.segments[0].ident.to_string();
            if is_path_start(&first) {
                let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
                self.record(&segs, p.segments[0].ident.span().start().line);
            }
        }
        syn::visit::visit_path(self, p);
    }

    // `pub(in crate::runtime)` names where an item is visible, not a use.
    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {}

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.scan_tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

/// The rules: for each module, the modules it may use (`None`: any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub may_use: BTreeMap<String, Option<BTreeSet<String>>>,
    /// Edges allowed although the table forbids them, each with its reason.
    pub exceptions: BTreeMap<(String, String), String>,
    /// File cycles allowed (the files, as `framework/src/...`), each with its
    /// reason.
    pub cycle_exceptions: BTreeMap<BTreeSet<String>, String>,
}

pub const BEGIN: &str = "<!-- dependency-rules:begin -->";
pub const END: &str = "<!-- dependency-rules:end -->";

/// Reads the rules from the marked section of a markdown text: a table
/// `| module | may use |` (`nothing`, `everything`, or backticked names
/// separated by commas) and, optionally, a table `| allowed exception | reason |`
/// whose first cell is `` `from` -> `to` `` (a module edge) or
/// `` `a.rs` <-> `b.rs` `` (a file cycle, paths from the workspace root).
pub fn parse_rules(markdown: &str) -> Result<Rules, String> {
    let start = markdown
        .find(BEGIN)
        .ok_or_else(|| format!("no `{BEGIN}` line"))?;
    let end = markdown[start..]
        .find(END)
        .ok_or_else(|| format!("no `{END}` line"))?
        + start;
    let mut rules = Rules::default();
    #[derive(PartialEq)]
    enum Table {
        None,
        Rules,
        Exceptions,
    }
    let mut table = Table::None;
    for (n, line) in markdown[start..end].lines().enumerate() {
        let line = line.trim();
        if !line.starts_with('|') {
            table = Table::None;
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells
            .iter()
            .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
        {
            continue;
        }
        let head = cells[0].to_ascii_lowercase();
        if table == Table::None {
            table = match head.as_str() {
                "module" => Table::Rules,
                "allowed exception" => Table::Exceptions,
                _ => {
                    return Err(format!(
                        "rules line {}: unknown table `{}`",
                        n + 1,
                        cells[0]
                    ));
                }
            };
            continue;
        }
        let second = cells.get(1).copied().unwrap_or("");
        match table {
            Table::Rules => {
                let module = first_name(cells[0])
                    .ok_or_else(|| format!("rules line {}: no module name", n + 1))?;
                let allowed = match second {
                    "nothing" => Some(BTreeSet::new()),
                    "everything" => None,
                    s => Some(names(s)),
                };
                if rules.may_use.insert(module.clone(), allowed).is_some() {
                    return Err(format!("rules: `{module}` has two rows"));
                }
            }
            Table::Exceptions if cells[0].contains("<->") => {
                if second.is_empty() {
                    return Err(format!(
                        "rules line {}: an exception needs its reason",
                        n + 1
                    ));
                }
                rules
                    .cycle_exceptions
                    .insert(names(cells[0]), second.to_string());
            }
            Table::Exceptions => {
                let edge: Vec<&str> = cells[0].split("->").collect();
                let [from, to] = edge[..] else {
                    return Err(format!(
                        "rules line {}: an exception is `from` -> `to`",
                        n + 1
                    ));
                };
                let (Some(from), Some(to)) = (first_name(from), first_name(to)) else {
                    return Err(format!(
                        "rules line {}: an exception is `from` -> `to`",
                        n + 1
                    ));
                };
                if second.is_empty() {
                    return Err(format!(
                        "rules line {}: an exception needs its reason",
                        n + 1
                    ));
                }
                rules.exceptions.insert((from, to), second.to_string());
            }
            Table::None => {}
        }
    }
    for (module, allowed) in &rules.may_use {
        for name in allowed.iter().flatten() {
            if !rules.may_use.contains_key(name) {
                return Err(format!(
                    "rules: `{module}` may use `{name}`, which has no row"
                ));
            }
        }
    }
    Ok(rules)
}

fn names(s: &str) -> BTreeSet<String> {
    s.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, n)| n.trim().to_string())
        .collect()
}

fn first_name(s: &str) -> Option<String> {
    names(s).into_iter().next().or_else(|| {
        let t = s.trim();
        (!t.is_empty() && !t.contains(' ')).then(|| t.to_string())
    })
}

impl Rules {
    /// The row a module belongs to: the longest prefix of its path (without a
    /// leading `blocks`, since `blocks::fence` is `crate::fence` inside the
    /// crate) that has a row; the crate root is `crate`.
    pub fn row_of(&self, module: &[String]) -> Option<String> {
        let m: &[String] = match module {
            [first, rest @ ..] if first == "blocks" && !rest.is_empty() => rest,
            m => m,
        };
        if m.is_empty() {
            return self.may_use.contains_key("crate").then(|| "crate".into());
        }
        (1..=m.len())
            .rev()
            .map(|n| m[..n].join("::"))
            .find(|name| self.may_use.contains_key(name))
    }

    /// A cycle among the rules themselves, if any (the table must be layered).
    pub fn cycle(&self) -> Option<Vec<String>> {
        let graph: BTreeMap<String, BTreeSet<String>> = self
            .may_use
            .iter()
            .filter_map(|(m, a)| a.as_ref().map(|a| (m.clone(), a.clone())))
            .collect();
        sccs(&graph).into_iter().next()
    }
}

/// A reference a rule forbids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub file: String,
    pub line: usize,
    pub from: String,
    pub to: String,
    pub written: String,
    /// What `from` may use, as the rules table says.
    pub rule: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: `{}` uses `{}` (`{}`); the rule: `{}` may use {}",
            self.file, self.line, self.from, self.to, self.written, self.from, self.rule
        )
    }
}

/// Files that import from one another, with the references that close the
/// circle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCycle {
    pub files: Vec<String>,
    /// `file:line: path` for each reference between two files of the cycle.
    pub edges: Vec<String>,
}

impl fmt::Display for FileCycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "import cycle among {}:", self.files.join(", "))?;
        for e in &self.edges {
            writeln!(f, "    {e}")?;
        }
        Ok(())
    }
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub cycles: Vec<FileCycle>,
    /// Modules without a row, rows without a module, a cycle in the table.
    pub problems: Vec<String>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty() && self.cycles.is_empty() && self.problems.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.problems {
            writeln!(f, "{p}")?;
        }
        if !self.violations.is_empty() {
            writeln!(f, "{} forbidden edge(s):", self.violations.len())?;
            for v in &self.violations {
                writeln!(f, "  {v}")?;
            }
        }
        for c in &self.cycles {
            write!(f, "  {c}")?;
        }
        Ok(())
    }
}

/// Checks the files against the rules.
pub fn check(files: &[SourceFile], rules: &Rules) -> Result<Report, String> {
    let (index, refs) = references(files)?;
    let mut report = Report::default();
    if let Some(c) = rules.cycle() {
        report
            .problems
            .push(format!("the rules table has a cycle: {}", c.join(", ")));
    }
    let mut rows_seen = BTreeSet::new();
    for path in index.modules.keys() {
        match rules.row_of(path) {
            Some(row) => {
                rows_seen.insert(row);
            }
            None => report.problems.push(format!(
                "module `{}` has no row in the rules table",
                path.join("::")
            )),
        }
    }
    for row in rules.may_use.keys() {
        if !rows_seen.contains(row) {
            report.problems.push(format!(
                "the rules table's `{row}` is no module of the crate"
            ));
        }
    }

    let mut file_edges: BTreeMap<usize, BTreeMap<usize, Vec<String>>> = BTreeMap::new();
    for r in &refs {
        let (Some(from), Some(to)) = (rules.row_of(&r.from), rules.row_of(&r.to.module)) else {
            continue;
        };
        let file = &files[r.file].path;
        if from != to
            && !rules.exceptions.contains_key(&(from.clone(), to.clone()))
            && let Some(Some(allowed)) = rules.may_use.get(&from)
            && !allowed.contains(&to)
        {
            report.violations.push(Violation {
                file: format!("framework/src/{file}"),
                line: r.line,
                from: from.clone(),
                to: to.clone(),
                written: r.written.clone(),
                rule: describe(allowed),
            });
        }
        let (a, b) = (&files[r.file].module, &files[r.to.file].module);
        if r.file != r.to.file && !a.starts_with(b) && !b.starts_with(a) {
            file_edges
                .entry(r.file)
                .or_default()
                .entry(r.to.file)
                .or_default()
                .push(format!("{file}:{}: {}", r.line, r.written));
        }
    }

    let graph: BTreeMap<usize, BTreeSet<usize>> = file_edges
        .iter()
        .map(|(a, tos)| (*a, tos.keys().copied().collect()))
        .collect();
    for scc in sccs(&graph) {
        let members: BTreeSet<usize> = scc.iter().copied().collect();
        let mut edges = Vec::new();
        for a in &scc {
            for (b, lines) in file_edges.get(a).into_iter().flatten() {
                if members.contains(b) {
                    edges.extend(lines.iter().map(|l| format!("{l} -> {}", files[*b].path)));
                }
            }
        }
        let names: Vec<String> = scc
            .iter()
            .map(|i| format!("framework/src/{}", files[*i].path))
            .collect();
        let key: BTreeSet<String> = names.iter().cloned().collect();
        if !rules.cycle_exceptions.contains_key(&key) {
            report.cycles.push(FileCycle {
                files: names,
                edges,
            });
        }
    }
    Ok(report)
}

fn describe(allowed: &BTreeSet<String>) -> String {
    if allowed.is_empty() {
        "nothing".into()
    } else {
        allowed
            .iter()
            .map(|a| format!("`{a}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Strongly connected components of more than one node (Tarjan), each sorted.
fn sccs<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct State<N> {
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        on_stack: BTreeSet<N>,
        next: usize,
        out: Vec<Vec<N>>,
    }
    fn visit<N: Ord + Clone>(v: &N, g: &BTreeMap<N, BTreeSet<N>>, s: &mut State<N>) {
        s.index.insert(v.clone(), s.next);
        s.low.insert(v.clone(), s.next);
        s.next += 1;
        s.stack.push(v.clone());
        s.on_stack.insert(v.clone());
        for w in g.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, g, s);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v.clone(), lv.min(lw));
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v.clone(), lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, graph, &mut s);
        }
    }
    s.out.sort();
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, module: &[&str], text: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            module: module.iter().map(|s| s.to_string()).collect(),
            text: text.into(),
        }
    }

    const RULES: &str = "intro
<!-- dependency-rules:begin -->
| module | may use |
|---|---|
| `crate` (the facade) | everything |
| `types` | nothing |
| `low` | `types` |
| `high` | `low`, `types` |
<!-- dependency-rules:end -->
";

    /// A crate: `types` (a file), `low` (a directory: `mod.rs`, `a.rs`,
    /// `b.rs`), `high`; the root re-exports `types::Id`.
    fn krate(low_a: &str, low_b: &str, types: &str) -> Vec<SourceFile> {
        vec![
            file(
                "lib.rs",
                &[],
                "mod high; mod low; mod types; pub use types::Id;",
            ),
            file("types.rs", &["types"], types),
            file("low/mod.rs", &["low"], "mod a; mod b; pub use a::A;"),
            file("low/a.rs", &["low", "a"], low_a),
            file("low/b.rs", &["low", "b"], low_b),
            file(
                "high.rs",
                &["high"],
                "use crate::low::A;\nfn f() -> crate::Id { todo!() }",
            ),
        ]
    }

    fn report(files: &[SourceFile], rules: &str) -> Report {
        let rules = parse_rules(rules).expect("rules");
        check(files, &rules).expect("check")
    }

    #[test]
    fn rules_are_read_from_the_marked_table() {
        let rules = parse_rules(RULES).expect("rules");
        assert_eq!(rules.may_use["crate"], None);
        assert_eq!(rules.may_use["types"], Some(BTreeSet::new()));
        let high: BTreeSet<String> = ["low", "types"].map(String::from).into();
        assert_eq!(rules.may_use["high"], Some(high));
        assert!(rules.cycle().is_none());
        assert!(parse_rules("no markers").is_err());
        let unknown = RULES.replace("`low`, `types`", "`nowhere`");
        assert!(parse_rules(&unknown).is_err(), "a name without a row");
    }

    #[test]
    fn a_layered_crate_is_clean() {
        let files = krate("pub struct A;", "use super::A;", "pub struct Id;");
        let r = report(&files, RULES);
        assert!(r.is_clean(), "{r}");
    }

    #[test]
    fn a_use_against_the_rules_is_reported_with_its_line() {
        let types = "pub struct Id;\n\nuse crate::low::A;";
        let files = krate("pub struct A;", "", types);
        let r = report(&files, RULES);
        assert_eq!(r.violations.len(), 1, "{r}");
        let v = &r.violations[0];
        assert_eq!((v.file.as_str(), v.line), ("framework/src/types.rs", 3));
        assert_eq!((v.from.as_str(), v.to.as_str()), ("types", "low"));
        assert_eq!(v.rule, "nothing");
    }

    #[test]
    fn paths_in_code_and_macros_count_and_re_exports_resolve() {
        // `crate::Id` is `types::Id`: allowed for `low`. A path in a macro
        // body and one in a signature to `high` are not.
        let low_a = "pub struct A;\nfn f(_: crate::Id) {}\nfn g() { println!(\"{}\", crate::high::X); }\nfn h(_: crate::high::Y) {}";
        let files = krate(low_a, "", "pub struct Id;");
        let r = report(&files, RULES);
        let lines: Vec<(usize, &str)> = r
            .violations
            .iter()
            .map(|v| (v.line, v.to.as_str()))
            .collect();
        assert_eq!(lines, [(3, "high"), (4, "high")], "{r}");
    }

    #[test]
    fn test_only_items_and_visibility_paths_do_not_count() {
        let types = "pub struct Id;\npub(in crate::types) struct P;\n#[cfg(test)]\nmod tests { use crate::high::X; }";
        let files = krate("pub struct A;", "", types);
        let r = report(&files, RULES);
        assert!(r.is_clean(), "{r}");
    }

    #[test]
    fn files_importing_from_each_other_are_a_cycle() {
        let files = krate(
            "pub struct A;\nuse super::b::B;",
            "pub struct B;\nuse super::a::A;",
            "pub struct Id;",
        );
        let r = report(&files, RULES);
        assert!(r.violations.is_empty(), "{r}");
        assert_eq!(r.cycles.len(), 1, "{r}");
        assert_eq!(
            r.cycles[0].files,
            ["framework/src/low/a.rs", "framework/src/low/b.rs"]
        );
        // Through the parent's re-export (`super::A` is `a.rs`'s) it is the
        // same cycle; a child reading its parent's own items is none.
        let files = krate(
            "pub struct A;\nuse super::b::B;",
            "pub struct B;\nuse super::A;",
            "pub struct Id;",
        );
        assert_eq!(report(&files, RULES).cycles.len(), 1);
        let exempt = format!(
            "{}\n\n| allowed exception | reason |\n|---|---|\n| `framework/src/low/a.rs` <-> `framework/src/low/b.rs` | a reason |\n{END}",
            RULES.replace(END, "").trim_end()
        );
        assert!(report(&files, &exempt).is_clean());
    }

    #[test]
    fn an_allowed_exception_silences_its_edge_only() {
        let types = "pub struct Id;\nuse crate::low::A;\nuse crate::high::H;";
        let files = krate("pub struct A;", "", types);
        let rules = format!(
            "{}\n\n| allowed exception | reason |\n|---|---|\n| `types` -> `low` | a reason |\n{END}",
            RULES.replace(END, "").trim_end()
        );
        let r = report(&files, &rules);
        let to: Vec<&str> = r.violations.iter().map(|v| v.to.as_str()).collect();
        assert_eq!(to, ["high"], "{r}");
    }

    #[test]
    fn a_module_without_a_row_and_a_layering_cycle_are_problems() {
        let mut files = krate("pub struct A;", "", "pub struct Id;");
        files[0].text.push_str(" mod extra {}");
        let cyclic = RULES.replace("| `low` | `types` |", "| `low` | `high` |");
        let r = report(&files, &cyclic);
        assert!(
            r.problems.iter().any(|p| p.contains("`extra` has no row")),
            "{r}"
        );
        assert!(r.problems.iter().any(|p| p.contains("has a cycle")), "{r}");
    }

    #[test]
    fn a_function_and_a_module_of_one_name_resolve_by_position() {
        let idx_files = vec![
            file("lib.rs", &[], "mod q;"),
            file("q/mod.rs", &["q"], "mod setup; fn setup() {} pub struct Q;"),
            file("q/setup.rs", &["q", "setup"], "pub struct S;"),
        ];
        let (index, _) = references(&idx_files).expect("refs");
        let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            index.resolve(&path(&["q", "setup"])).map(|t| t.file),
            Some(1)
        );
        assert_eq!(
            index.resolve(&path(&["q", "setup", "S"])).map(|t| t.file),
            Some(2)
        );
    }
}
