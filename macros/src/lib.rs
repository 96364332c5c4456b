//! Procedural macros for [`tenure`](https://docs.rs/tenure). Use them through the
//! `tenure` crate (`#[tenure::job]`, `#[tenure::step]`), not directly.

use proc_macro::TokenStream;

/// Placeholder: filled in by the runtime/macro issue.
#[proc_macro_attribute]
pub fn job(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}

/// Marks a step inside a `#[job]` impl block. On its own it does nothing.
#[proc_macro_attribute]
pub fn step(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
