//! Syntactic comparison of one step's output type with the next step's input type.
//!
//! A proc-macro sees tokens, not types: `Reserved` and `crate::model::Reserved` may
//! be the same type, and any path may be an alias. So the macro only decides two
//! things here:
//! - the two types are spelled the same (then they are the same type: no check is
//!   generated), or
//! - they are *certainly* different (e.g. `()` and `u32`, or tuples of different
//!   lengths): a custom error is reported right away.
//!
//! Everything else is left to rustc through a generated trait bound whose
//! `#[diagnostic::on_unimplemented]` message names both steps (see `expand`).
//!
//! "Certainly" assumes that nobody names a type after a primitive (`struct u32;`).

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Expr, ExprLit, Lit, Type};

use crate::parse::strip;

/// How two consecutive step types relate, as far as tokens can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Relation {
    /// Spelled the same: the same type.
    Same,
    /// Certainly different types.
    Different,
    /// Only rustc can tell.
    Unknown,
}

/// Compares `output` (of step k) with `input` (of step k + 1).
pub(crate) fn relate(output: &Type, input: &Type) -> Relation {
    if spelling(output) == spelling(input) {
        Relation::Same
    } else if certainly_different(output, input) {
        Relation::Different
    } else {
        Relation::Unknown
    }
}

/// The type's tokens, whitespace-independent, without outer parentheses and
/// invisible groups.
pub(crate) fn spelling(ty: &Type) -> String {
    let mut out = Vec::new();
    flatten(strip(ty).to_token_stream(), &mut out);
    out.join(" ")
}

fn flatten(tokens: TokenStream, out: &mut Vec<String>) {
    for tree in tokens {
        match tree {
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    proc_macro2::Delimiter::Parenthesis => ("(", ")"),
                    proc_macro2::Delimiter::Brace => ("{", "}"),
                    proc_macro2::Delimiter::Bracket => ("[", "]"),
                    proc_macro2::Delimiter::None => ("", ""),
                };
                if !open.is_empty() {
                    out.push(open.to_owned());
                }
                flatten(g.stream(), out);
                if !close.is_empty() {
                    out.push(close.to_owned());
                }
            }
            other => out.push(other.to_string()),
        }
    }
}

const PRIMITIVES: &[&str] = &[
    "bool", "char", "str", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64",
    "i128", "isize", "f32", "f64",
];

#[derive(Debug, PartialEq, Eq)]
enum Shape {
    Primitive(String),
    Tuple,
    Array,
    Slice,
    Reference,
    Pointer,
    Never,
    BareFn,
    /// A path (maybe an alias), a macro, a trait object...: anything.
    Opaque,
}

fn shape(ty: &Type) -> Shape {
    match ty {
        Type::Path(p) if p.qself.is_none() && p.path.leading_colon.is_none() => {
            match p.path.get_ident() {
                Some(ident) if PRIMITIVES.iter().any(|prim| ident == prim) => {
                    Shape::Primitive(ident.to_string())
                }
                _ => Shape::Opaque,
            }
        }
        Type::Tuple(_) => Shape::Tuple,
        Type::Array(_) => Shape::Array,
        Type::Slice(_) => Shape::Slice,
        Type::Reference(_) => Shape::Reference,
        Type::Ptr(_) => Shape::Pointer,
        Type::Never(_) => Shape::Never,
        Type::BareFn(_) => Shape::BareFn,
        _ => Shape::Opaque,
    }
}

/// Whether `a` and `b` can be told apart without resolving any path.
pub(crate) fn certainly_different(a: &Type, b: &Type) -> bool {
    let (a, b) = (strip(a), strip(b));
    let (sa, sb) = (shape(a), shape(b));
    if sa == Shape::Opaque || sb == Shape::Opaque {
        return false;
    }
    if sa != sb {
        // Different primitives, or different kinds of type.
        return true;
    }
    match (a, b) {
        (Type::Tuple(x), Type::Tuple(y)) => {
            x.elems.len() != y.elems.len()
                || x.elems
                    .iter()
                    .zip(&y.elems)
                    .any(|(x, y)| certainly_different(x, y))
        }
        (Type::Array(x), Type::Array(y)) => {
            certainly_different(&x.elem, &y.elem)
                || matches!((int(&x.len), int(&y.len)), (Some(m), Some(n)) if m != n)
        }
        (Type::Slice(x), Type::Slice(y)) => certainly_different(&x.elem, &y.elem),
        (Type::Reference(x), Type::Reference(y)) => {
            x.mutability.is_some() != y.mutability.is_some()
                || certainly_different(&x.elem, &y.elem)
        }
        (Type::Ptr(x), Type::Ptr(y)) => {
            x.mutability.is_some() != y.mutability.is_some()
                || certainly_different(&x.elem, &y.elem)
        }
        (Type::BareFn(x), Type::BareFn(y)) => x.inputs.len() != y.inputs.len(),
        _ => false,
    }
}

fn int(e: &Expr) -> Option<u128> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => i.base10_parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use syn::parse_quote;

    use super::*;

    fn rel(a: Type, b: Type) -> Relation {
        relate(&a, &b)
    }

    #[test]
    fn same_spelling() {
        assert_eq!(
            rel(parse_quote!(Reserved), parse_quote!(Reserved)),
            Relation::Same
        );
        assert_eq!(
            rel(parse_quote!(Vec<u32>), parse_quote!(Vec<u32>)),
            Relation::Same
        );
        assert_eq!(rel(parse_quote!(()), parse_quote!(())), Relation::Same);
        assert_eq!(rel(parse_quote!((u8)), parse_quote!(u8)), Relation::Same);
        assert_eq!(
            rel(
                parse_quote!(std::collections::HashMap<String, (u8, u16)>),
                parse_quote!(std::collections::HashMap<String,(u8,u16)>)
            ),
            Relation::Same
        );
    }

    #[test]
    fn certainly_different_types() {
        let cases: Vec<(Type, Type)> = vec![
            (parse_quote!(u32), parse_quote!(u64)),
            (parse_quote!(()), parse_quote!(u32)),
            (parse_quote!((u8)), parse_quote!(())),
            (parse_quote!((u8, u8)), parse_quote!((u8, u8, u8))),
            (parse_quote!((u8, Foo)), parse_quote!((u16, Foo))),
            (parse_quote!([u8; 4]), parse_quote!([u8; 5])),
            (parse_quote!([u8; 4]), parse_quote!((u8, u8, u8, u8))),
            (parse_quote!(&'static str), parse_quote!(bool)),
            (parse_quote!(&mut u8), parse_quote!(&u8)),
        ];
        for (a, b) in cases {
            assert_eq!(
                relate(&a, &b),
                Relation::Different,
                "{} vs {}",
                spelling(&a),
                spelling(&b)
            );
        }
    }

    #[test]
    fn paths_are_left_to_rustc() {
        let cases: Vec<(Type, Type)> = vec![
            (parse_quote!(Reserved), parse_quote!(Debited)),
            (parse_quote!(Reserved), parse_quote!(crate::Reserved)),
            (parse_quote!(Vec<u8>), parse_quote!(Vec<u16>)),
            (parse_quote!(Alias), parse_quote!(u32)),
            (parse_quote!(u32), parse_quote!(String)),
            (parse_quote!([u8; 4]), parse_quote!(Vec<u8>)),
            (parse_quote!((Foo, u8)), parse_quote!((Bar, u8))),
            (parse_quote!(Alias), parse_quote!(())),
            (parse_quote!((Alias, u8)), parse_quote!((u32, u8))),
            (parse_quote!([u8; N]), parse_quote!([u8; 4])),
        ];
        for (a, b) in cases {
            assert_eq!(
                relate(&a, &b),
                Relation::Unknown,
                "{} vs {}",
                spelling(&a),
                spelling(&b)
            );
        }
    }
}
