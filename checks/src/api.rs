//! The public API of `tenure` as a list of paths (see `framework/public-api.txt`).
//!
//! [`list`] parses the crate's sources with `syn`, starting at its `lib.rs` and
//! following `mod x;` declarations (`x.rs`, `x/mod.rs` or `#[path]`), and lists
//! every item a user can name, one line per item, `kind path`, sorted:
//!
//! ```text
//! fn tenure::config::parse_duration
//! method tenure::Config::with_vars
//! struct tenure::Config
//! ```
//!
//! An item is listed when it is `pub` and every module on its path is `pub`;
//! an item of a private module is listed under the path a `pub use` (named or
//! glob) gives it. A re-exported item is listed under every public path it has;
//! the `pub` methods and associated consts of its inherent impls, and the items
//! of a public trait, are listed once, under its shortest public path. Items
//! behind `#[cfg(test)]` or `#[doc(hidden)]` are left out; every feature is
//! taken as enabled (nothing in the listing says which feature an item needs).
//! A `pub use` of another crate's item is listed as `reexport path = source`;
//! a `#[macro_export]` macro as `macro <crate>::name`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use syn::{Attribute, ImplItem, Item, Meta, TraitItem, UseTree, Visibility};

use crate::item_attrs;

/// The public API of the crate whose root is `lib` (e.g. `framework/src/lib.rs`),
/// read from disk, as sorted `kind path` lines under the name `crate_name`.
pub fn list(lib: &Path, crate_name: &str) -> Result<Vec<String>, String> {
    list_with(
        &|path: &Path| std::fs::read_to_string(path).ok(),
        lib,
        crate_name,
    )
}

/// [`list`] over any source of files (`read` returns a file's text, `None` if it
/// does not exist): the unit tests use in-memory sources.
pub fn list_with(
    read: &dyn Fn(&Path) -> Option<String>,
    lib: &Path,
    crate_name: &str,
) -> Result<Vec<String>, String> {
    let mut loader = Loader {
        read,
        modules: Vec::new(),
        macros: Vec::new(),
    };
    let dir = lib.parent().map(Path::to_path_buf).unwrap_or_default();
    loader.load_file(lib, None, dir)?;
    let api = Api {
        modules: &loader.modules,
    };
    let mut out = Listing::default();
    api.walk(0, crate_name, &mut out, &mut HashSet::new());
    api.members(&mut out);
    for name in &loader.macros {
        out.lines.insert(format!("macro {crate_name}::{name}"));
    }
    Ok(out.lines.into_iter().collect())
}

/// What an item is, as the listing names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mod,
    Struct,
    Enum,
    Union,
    Trait,
    Fn,
    Const,
    Static,
    Type,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Mod => "mod",
            Kind::Struct => "struct",
            Kind::Enum => "enum",
            Kind::Union => "union",
            Kind::Trait => "trait",
            Kind::Fn => "fn",
            Kind::Const => "const",
            Kind::Static => "static",
            Kind::Type => "type",
        }
    }
}

/// `pub`, `pub(crate)`/`pub(super)`/`pub(in ..)`, or private.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vis {
    Public,
    Restricted,
    Private,
}

impl Vis {
    fn of(vis: &Visibility) -> Vis {
        match vis {
            Visibility::Public(_) => Vis::Public,
            Visibility::Restricted(_) => Vis::Restricted,
            Visibility::Inherited => Vis::Private,
        }
    }
}

/// An item declared in a module.
#[derive(Debug)]
struct Decl {
    kind: Kind,
    name: String,
    vis: Vis,
    /// The module it is, for `Kind::Mod`.
    module: Option<usize>,
    /// A trait's items (`method`, `assoc_const`, `assoc_type` and a name).
    members: Vec<(&'static str, String)>,
}

/// One name a `use` brings in (`name: None` for a glob).
#[derive(Debug)]
struct Import {
    vis: Vis,
    path: Vec<String>,
    name: Option<String>,
}

/// An inherent impl: the self type's path as written, and its public members.
#[derive(Debug)]
struct Impl {
    self_path: Vec<String>,
    members: Vec<(&'static str, String)>,
}

#[derive(Debug, Default)]
struct Module {
    parent: Option<usize>,
    decls: Vec<Decl>,
    imports: Vec<Import>,
    impls: Vec<Impl>,
}

/// What a name resolves to: a declaration (module index, declaration index) or
/// another crate's item.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Decl(usize, usize),
    /// A module named by `crate`, `self` or `super`.
    Module(usize),
    External(String),
}

struct Loader<'a> {
    read: &'a dyn Fn(&Path) -> Option<String>,
    modules: Vec<Module>,
    macros: Vec<String>,
}

impl Loader<'_> {
    /// Parses `file` as a new module (child of `parent`); its `mod x;` files are
    /// looked up in `child_dir`.
    fn load_file(
        &mut self,
        file: &Path,
        parent: Option<usize>,
        child_dir: PathBuf,
    ) -> Result<usize, String> {
        let text = (self.read)(file).ok_or_else(|| format!("cannot read {}", file.display()))?;
        let parsed =
            syn::parse_file(&text).map_err(|e| format!("cannot parse {}: {e}", file.display()))?;
        let id = self.new_module(parent);
        let file_dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let dirs = Dirs {
            child: child_dir,
            path_base: file_dir,
        };
        self.load_items(id, &parsed.items, &dirs)?;
        Ok(id)
    }

    fn new_module(&mut self, parent: Option<usize>) -> usize {
        self.modules.push(Module {
            parent,
            ..Module::default()
        });
        self.modules.len() - 1
    }

    fn load_items(&mut self, id: usize, items: &[Item], dirs: &Dirs) -> Result<(), String> {
        for item in items {
            if !enabled(item_attrs(item)) {
                continue;
            }
            if hidden(item_attrs(item)) {
                continue;
            }
            match item {
                Item::Mod(m) => self.load_mod(id, m, dirs)?,
                Item::Use(u) => {
                    let mut imports = Vec::new();
                    let root = if u.leading_colon.is_some() {
                        vec!["::".into()]
                    } else {
                        vec![]
                    };
                    flatten_use(&u.tree, root, Vis::of(&u.vis), &mut imports);
                    self.modules[id].imports.extend(imports);
                }
                Item::Impl(i) if i.trait_.is_none() => {
                    if let Some(block) = inherent_impl(i) {
                        self.modules[id].impls.push(block);
                    }
                }
                Item::Macro(m) if m.attrs.iter().any(|a| a.path().is_ident("macro_export")) => {
                    if let Some(ident) = &m.ident {
                        self.macros.push(ident.to_string());
                    }
                }
                _ => {
                    if let Some(decl) = declaration(item) {
                        self.modules[id].decls.push(decl);
                    }
                }
            }
        }
        Ok(())
    }

    /// `mod x;` (loaded from its file) or `mod x { .. }`.
    fn load_mod(&mut self, parent: usize, m: &syn::ItemMod, dirs: &Dirs) -> Result<(), String> {
        let name = m.ident.to_string();
        let id = match &m.content {
            Some((_, items)) => {
                let id = self.new_module(Some(parent));
                let inner = Dirs {
                    child: dirs.child.join(&name),
                    path_base: dirs.child.join(&name),
                };
                self.load_items(id, items, &inner)?;
                id
            }
            None => {
                let (file, child_dir) = self.mod_file(m, &name, dirs)?;
                self.load_file(&file, Some(parent), child_dir)?
            }
        };
        let decl = Decl {
            kind: Kind::Mod,
            name,
            vis: Vis::of(&m.vis),
            module: Some(id),
            members: Vec::new(),
        };
        self.modules[parent].decls.push(decl);
        Ok(())
    }

    /// The file of `mod name;` and the directory of its own `mod` files.
    fn mod_file(
        &self,
        m: &syn::ItemMod,
        name: &str,
        dirs: &Dirs,
    ) -> Result<(PathBuf, PathBuf), String> {
        if let Some(path) = path_attr(&m.attrs) {
            let file = dirs.path_base.join(path);
            let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
            return Ok((file, dir));
        }
        let flat = dirs.child.join(format!("{name}.rs"));
        if (self.read)(&flat).is_some() {
            return Ok((flat, dirs.child.join(name)));
        }
        let nested = dirs.child.join(name).join("mod.rs");
        if (self.read)(&nested).is_some() {
            return Ok((nested, dirs.child.join(name)));
        }
        Err(format!(
            "no file for `mod {name};` in {}",
            dirs.child.display()
        ))
    }
}

/// Where a module's `mod x;` files are (`child`) and what a `#[path]` is
/// relative to (`path_base`: the file's directory at its top level).
struct Dirs {
    child: PathBuf,
    path_base: PathBuf,
}

/// A named item other than a module, a `use`, an impl or a macro.
fn declaration(item: &Item) -> Option<Decl> {
    let (kind, ident, vis) = match item {
        Item::Const(i) => (Kind::Const, &i.ident, &i.vis),
        Item::Enum(i) => (Kind::Enum, &i.ident, &i.vis),
        Item::Fn(i) => (Kind::Fn, &i.sig.ident, &i.vis),
        Item::Static(i) => (Kind::Static, &i.ident, &i.vis),
        Item::Struct(i) => (Kind::Struct, &i.ident, &i.vis),
        Item::Trait(i) => (Kind::Trait, &i.ident, &i.vis),
        Item::Type(i) => (Kind::Type, &i.ident, &i.vis),
        Item::Union(i) => (Kind::Union, &i.ident, &i.vis),
        _ => return None,
    };
    let members = match item {
        Item::Trait(t) => trait_members(t),
        _ => Vec::new(),
    };
    Some(Decl {
        kind,
        name: ident.to_string(),
        vis: Vis::of(vis),
        module: None,
        members,
    })
}

fn trait_members(t: &syn::ItemTrait) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for item in &t.items {
        let (attrs, member) = match item {
            TraitItem::Fn(f) => (&f.attrs, ("method", f.sig.ident.to_string())),
            TraitItem::Const(c) => (&c.attrs, ("assoc_const", c.ident.to_string())),
            TraitItem::Type(t) => (&t.attrs, ("assoc_type", t.ident.to_string())),
            _ => continue,
        };
        if enabled(attrs) && !hidden(attrs) {
            out.push(member);
        }
    }
    out
}

/// An inherent impl's self type and `pub` fns and consts (none if hidden or
/// the self type is not a plain path).
fn inherent_impl(i: &syn::ItemImpl) -> Option<Impl> {
    let syn::Type::Path(ty) = &*i.self_ty else {
        return None;
    };
    let self_path = ty
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    let mut members = Vec::new();
    for item in &i.items {
        let (attrs, vis, member) = match item {
            ImplItem::Fn(f) => (&f.attrs, &f.vis, ("method", f.sig.ident.to_string())),
            ImplItem::Const(c) => (&c.attrs, &c.vis, ("assoc_const", c.ident.to_string())),
            _ => continue,
        };
        if Vis::of(vis) == Vis::Public && enabled(attrs) && !hidden(attrs) {
            members.push(member);
        }
    }
    Some(Impl { self_path, members })
}

/// The names a `use` tree brings in.
fn flatten_use(tree: &UseTree, prefix: Vec<String>, vis: Vis, out: &mut Vec<Import>) {
    let with = |name: String| {
        let mut path = prefix.clone();
        path.push(name);
        path
    };
    match tree {
        UseTree::Path(p) => flatten_use(&p.tree, with(p.ident.to_string()), vis, out),
        UseTree::Name(n) if n.ident == "self" => {
            let name = prefix.last().cloned();
            out.push(Import {
                vis,
                path: prefix.clone(),
                name,
            });
        }
        UseTree::Name(n) => {
            let name = n.ident.to_string();
            out.push(Import {
                vis,
                path: with(name.clone()),
                name: Some(name),
            });
        }
        UseTree::Rename(r) => {
            let path = if r.ident == "self" {
                prefix.clone()
            } else {
                with(r.ident.to_string())
            };
            out.push(Import {
                vis,
                path,
                name: Some(r.rename.to_string()),
            });
        }
        UseTree::Glob(_) => out.push(Import {
            vis,
            path: prefix.clone(),
            name: None,
        }),
        UseTree::Group(g) => {
            for tree in &g.items {
                flatten_use(tree, prefix.clone(), vis, out);
            }
        }
    }
}

/// Whether every `#[cfg]` holds with all features on and `test` off.
fn enabled(attrs: &[Attribute]) -> bool {
    attrs.iter().filter(|a| a.path().is_ident("cfg")).all(|a| {
        a.parse_args::<Meta>()
            .map(|m| cfg_holds(&m))
            .unwrap_or(true)
    })
}

fn cfg_holds(meta: &Meta) -> bool {
    let nested = |list: &syn::MetaList| {
        list.parse_args_with(syn::punctuated::Punctuated::<Meta, syn::Token![,]>::parse_terminated)
            .map(|p| p.into_iter().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    match meta {
        Meta::Path(p) => !p.is_ident("test"),
        Meta::NameValue(_) => true,
        Meta::List(list) if list.path.is_ident("not") => !nested(list).iter().all(cfg_holds),
        Meta::List(list) if list.path.is_ident("any") => nested(list).iter().any(cfg_holds),
        Meta::List(list) => nested(list).iter().all(cfg_holds),
    }
}

/// `#[doc(hidden)]`.
fn hidden(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| match &a.meta {
        Meta::List(list) if list.path.is_ident("doc") => list
            .tokens
            .clone()
            .into_iter()
            .any(|t| t.to_string() == "hidden"),
        _ => false,
    })
}

/// `#[path = ".."]`.
fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// The listing being built, and every public path of each declaration.
#[derive(Default)]
struct Listing {
    lines: BTreeSet<String>,
    paths: BTreeMap<(usize, usize), BTreeSet<String>>,
}

/// Name resolution over the loaded modules.
struct Api<'a> {
    modules: &'a [Module],
}

/// How deep `use` chains are followed (a cycle is a compile error anyway).
const MAX_DEPTH: usize = 32;

impl Api<'_> {
    /// Lists module `m`'s public contents under `path`.
    fn walk(&self, m: usize, path: &str, out: &mut Listing, seen: &mut HashSet<(usize, String)>) {
        if !seen.insert((m, path.to_string())) || path.matches("::").count() > MAX_DEPTH {
            return;
        }
        let module = &self.modules[m];
        for (i, decl) in module.decls.iter().enumerate() {
            if decl.vis == Vis::Public {
                self.emit(
                    Target::Decl(m, i),
                    &format!("{path}::{}", decl.name),
                    out,
                    seen,
                );
            }
        }
        for import in module.imports.iter().filter(|i| i.vis == Vis::Public) {
            let targets = self.resolve_path(m, &import.path, 0);
            match &import.name {
                Some(name) => {
                    for target in targets {
                        self.emit(target, &format!("{path}::{name}"), out, seen);
                    }
                }
                None => {
                    for target in targets {
                        if let Some(glob) = self.module_of(&target) {
                            self.walk(glob, path, out, seen);
                        }
                    }
                }
            }
        }
    }

    /// Lists `target` under `path` (and a module's contents under it).
    fn emit(
        &self,
        target: Target,
        path: &str,
        out: &mut Listing,
        seen: &mut HashSet<(usize, String)>,
    ) {
        match target {
            Target::Decl(m, i) => {
                let decl = &self.modules[m].decls[i];
                out.lines.insert(format!("{} {path}", decl.kind.word()));
                out.paths
                    .entry((m, i))
                    .or_default()
                    .insert(path.to_string());
                if let Some(child) = decl.module {
                    self.walk(child, path, out, seen);
                }
            }
            Target::Module(m) => self.walk(m, path, out, seen),
            Target::External(source) => {
                out.lines.insert(format!("reexport {path} = {source}"));
            }
        }
    }

    fn module_of(&self, target: &Target) -> Option<usize> {
        match target {
            Target::Decl(m, i) => self.modules[*m].decls[*i].module,
            Target::Module(m) => Some(*m),
            Target::External(_) => None,
        }
    }

    /// What `path`, written in module `m`, names.
    fn resolve_path(&self, m: usize, path: &[String], depth: usize) -> Vec<Target> {
        let Some((first, rest)) = path.split_first() else {
            return Vec::new();
        };
        let mut current = match first.as_str() {
            "::" => return vec![Target::External(rest.join("::"))],
            "crate" => vec![Target::Module(0)],
            "self" => vec![Target::Module(m)],
            "super" => vec![Target::Module(self.parent(m))],
            _ => self.resolve_name(m, first, true, depth),
        };
        if current.is_empty() {
            return vec![Target::External(path.join("::"))]; // another crate
        }
        for segment in rest {
            let mut next = Vec::new();
            let mut external = false;
            for target in &current {
                match (target, segment.as_str()) {
                    (Target::Module(id), "super") => next.push(Target::Module(self.parent(*id))),
                    (Target::External(_), _) => external = true,
                    (target, _) => {
                        if let Some(id) = self.module_of(target) {
                            next.extend(self.resolve_name(id, segment, true, depth));
                        }
                    }
                }
            }
            if next.is_empty() && external {
                return vec![Target::External(path.join("::"))];
            }
            current = next;
        }
        current.sort();
        current.dedup();
        current
    }

    fn parent(&self, m: usize) -> usize {
        self.modules[m].parent.unwrap_or(0)
    }

    /// What `name` is in module `m`: its declarations and imports of that name
    /// or, failing those, what its glob imports bring. Names a glob brings
    /// are not private ones (`all: false`).
    fn resolve_name(&self, m: usize, name: &str, all: bool, depth: usize) -> Vec<Target> {
        if depth > MAX_DEPTH {
            return Vec::new();
        }
        let module = &self.modules[m];
        let seen = |vis: Vis| all || vis != Vis::Private;
        let mut out: Vec<Target> = (module.decls.iter().enumerate())
            .filter(|(_, d)| d.name == name && seen(d.vis))
            .map(|(i, _)| Target::Decl(m, i))
            .collect();
        for import in &module.imports {
            if import.name.as_deref() != Some(name) || !seen(import.vis) {
                continue;
            }
            if import.path.len() == 1 && import.path[0] == name {
                out.push(Target::External(name.to_string())); // `use serde_json;`
            } else {
                out.extend(self.resolve_path(m, &import.path, depth + 1));
            }
        }
        if out.is_empty() {
            for glob in module
                .imports
                .iter()
                .filter(|i| i.name.is_none() && seen(i.vis))
            {
                for target in self.resolve_path(m, &glob.path, depth + 1) {
                    if let Some(id) = self.module_of(&target) {
                        out.extend(self.resolve_name(id, name, false, depth + 1));
                    }
                }
            }
        }
        out
    }

    /// The members of traits and inherent impls of listed types, under each
    /// type's shortest public path.
    fn members(&self, out: &mut Listing) {
        let mut lines = Vec::new();
        let canonical = |key: &(usize, usize)| {
            let paths = out.paths.get(key)?;
            paths
                .iter()
                .min_by_key(|p| (p.matches("::").count(), (*p).clone()))
                .cloned()
        };
        for (m, module) in self.modules.iter().enumerate() {
            for (i, decl) in module.decls.iter().enumerate() {
                if let Some(path) = canonical(&(m, i)) {
                    lines.extend(decl.members.iter().map(|(k, n)| format!("{k} {path}::{n}")));
                }
            }
            for block in &module.impls {
                for target in self.resolve_path(m, &block.self_path, 0) {
                    let Target::Decl(tm, ti) = target else {
                        continue;
                    };
                    if let Some(path) = canonical(&(tm, ti)) {
                        lines.extend(
                            block
                                .members
                                .iter()
                                .map(|(k, n)| format!("{k} {path}::{n}")),
                        );
                    }
                }
            }
        }
        out.lines.extend(lines);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Lists an in-memory crate: `files` are (path under `src/`, text).
    fn api(files: &[(&str, &str)]) -> Vec<String> {
        let files: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (Path::new("src").join(p), t.to_string()))
            .collect();
        let read = move |p: &Path| files.get(p).cloned();
        list_with(&read, Path::new("src/lib.rs"), "k").unwrap_or_else(|e| vec![e])
    }

    #[test]
    fn public_items_of_public_modules_only() {
        let lib = "pub mod a; mod b; pub fn f() {} fn g() {} pub(crate) struct S;";
        let a = "pub struct A; pub(crate) fn hid() {} pub mod inner { pub const C: u8 = 1; }";
        let b = "pub struct B;";
        let got = api(&[("lib.rs", lib), ("a.rs", a), ("b/mod.rs", b)]);
        assert_eq!(
            got,
            [
                "const k::a::inner::C",
                "fn k::f",
                "mod k::a",
                "mod k::a::inner",
                "struct k::a::A"
            ]
        );
    }

    #[test]
    fn re_exports_name_items_of_private_modules() {
        let lib = "mod b; pub mod c; pub(crate) use b::deep; pub use deep::{X as Y, Z}; pub use tenure_macros::job;";
        let b = "pub mod deep { pub struct X; pub fn Z() {} }";
        let c = "pub use crate::b::deep::*;";
        let got = api(&[("lib.rs", lib), ("b.rs", b), ("c.rs", c)]);
        let want = [
            "fn k::Z",
            "fn k::c::Z",
            "mod k::c",
            "reexport k::job = tenure_macros::job",
            "struct k::Y",
            "struct k::c::X",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn methods_under_the_shortest_path_and_hidden_or_test_items_left_out() {
        let lib = r#"pub mod m; pub use m::T;
            #[doc(hidden)] pub fn h() {}
            #[cfg(test)] pub fn t() {}
            #[cfg(feature = "x")] pub fn feat() {}
            #[macro_export] macro_rules! mac { () => {} }"#;
        let m = "pub struct T; impl T { pub fn new() {} fn private() {} pub const N: u8 = 0; #[doc(hidden)] pub fn h() {} }
            pub trait Tr { fn go(&self); }";
        let got = api(&[("lib.rs", lib), ("m.rs", m)]);
        let want = [
            "assoc_const k::T::N",
            "fn k::feat",
            "macro k::mac",
            "method k::T::new",
            "method k::m::Tr::go",
            "mod k::m",
            "struct k::T",
            "struct k::m::T",
            "trait k::m::Tr",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn path_attributes_and_missing_files() {
        let got = api(&[
            ("lib.rs", "#[path = \"other/x.rs\"] pub mod y;"),
            ("other/x.rs", "pub fn f() {}"),
        ]);
        assert_eq!(got, ["fn k::y::f", "mod k::y"]);
        let got = api(&[("lib.rs", "pub mod gone;")]);
        assert!(got[0].starts_with("no file for `mod gone;`"), "{got:?}");
    }
}
