//! Checks over Tenure's own source, run by `cargo test -p tenure-checks`
//! (and so by `make test`). They read the `framework` crate's files with
//! `syn`; nothing here builds or links `tenure`, so they run in seconds.
//!
//! - [`api`]: every public item of `tenure`, compared with the checked-in
//!   `framework/public-api.txt`.
//! - [`deps`]: the module dependency rules of `ARCHITECTURE.md`.

pub mod api;
pub mod deps;

use std::path::PathBuf;

/// The attributes of `item` (none for an item kind `syn` adds later).
pub(crate) fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
