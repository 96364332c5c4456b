//! `#[tenure::test]`: an async test function taking a `TestEnv`, turned into
//! a `#[test]` that runs it through `tenure::testing::__run`.
//!
//! ```text
//! #[tenure::test(ttl_secs = 3, worker = workers, own_stack, partitions = 4)]
//! async fn name(env: TestEnv) -> R { body }
//! ```
//! becomes
//! ```text
//! #[test]
//! fn name() {
//!     async fn __tenure_test_body(env: TestEnv) -> R { body }
//!     ::tenure::testing::__run(TestSpec { .. }, __tenure_test_body)
//! }
//! ```

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ExprPath, FnArg, ItemFn, Lit, Meta, Token};

use crate::errors::Errors;

/// The attribute's arguments.
#[derive(Default)]
struct TestArgs {
    ttl_secs: Option<u64>,
    worker: Option<ExprPath>,
    own_stack: bool,
    partitions: Option<u32>,
}

const KNOWN: &str =
    "expected `ttl_secs = N`, `worker = path::to::fn`, `own_stack` or `partitions = N`";

/// The most partitions a test may ask for (`tenure::config::MAX_PARTITIONS`).
const MAX_PARTITIONS: u32 = 1024;

/// The default lease TTL: tests that are not about lease loss use 10 s.
const DEFAULT_TTL_SECS: u64 = 10;

/// `#[tenure::test(..)]` on `item`: the test, or only the errors.
pub(crate) fn test(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let args = parse_args(attr, &mut errors);
    let func = match syn::parse2::<ItemFn>(item) {
        Ok(f) => f,
        Err(e) => {
            errors.at(
                e.span(),
                "#[tenure::test] goes on an `async fn name(env: TestEnv)`",
            );
            return errors.to_compile_errors();
        }
    };
    check_fn(&func, &mut errors);
    let errors_out = errors.to_compile_errors();
    if !errors_out.is_empty() {
        return errors_out;
    }
    generate(&func, &args)
}

fn parse_args(attr: TokenStream, errors: &mut Errors) -> TestArgs {
    let mut args = TestArgs::default();
    let metas = match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr) {
        Ok(m) => m,
        Err(e) => {
            errors.at(e.span(), format!("{e} ({KNOWN}, separated by commas)"));
            return args;
        }
    };
    for meta in metas {
        let key = meta.path().get_ident().map(ToString::to_string);
        match (key.as_deref(), &meta) {
            (Some("own_stack"), Meta::Path(_)) if !args.own_stack => args.own_stack = true,
            (Some("ttl_secs"), Meta::NameValue(nv)) if args.ttl_secs.is_none() => {
                args.ttl_secs = Some(ttl(&nv.value, errors));
            }
            (Some("partitions"), Meta::NameValue(nv)) if args.partitions.is_none() => {
                args.partitions = Some(partitions(&nv.value, errors));
            }
            (Some("worker"), Meta::NameValue(nv)) if args.worker.is_none() => match &nv.value {
                Expr::Path(p) => args.worker = Some(p.clone()),
                other => errors.spanned(
                    other,
                    "`worker` names a function `async fn(tenure::Config) -> tenure::WorkerBuilder`",
                ),
            },
            (
                Some("own_stack" | "ttl_secs" | "worker" | "partitions"),
                Meta::Path(_) | Meta::NameValue(_),
            ) if is_repeat(&meta, &args) => {
                errors.spanned(&meta, "duplicate argument");
            }
            _ => errors.spanned(&meta, format!("unknown or malformed argument: {KNOWN}")),
        }
    }
    args
}

/// Whether `meta` repeats an argument already given.
fn is_repeat(meta: &Meta, args: &TestArgs) -> bool {
    let key = meta.path().get_ident().map(ToString::to_string);
    match key.as_deref() {
        Some("own_stack") => args.own_stack,
        Some("ttl_secs") => args.ttl_secs.is_some(),
        Some("worker") => args.worker.is_some(),
        Some("partitions") => args.partitions.is_some(),
        _ => false,
    }
}

/// A TTL in whole seconds, at least 1.
fn ttl(value: &Expr, errors: &mut Errors) -> u64 {
    if let Expr::Lit(ExprLit {
        lit: Lit::Int(i), ..
    }) = value
    {
        match i.base10_parse::<u64>() {
            Ok(n) if n >= 1 => return n,
            _ => {}
        }
    }
    errors.spanned(value, "`ttl_secs` is a whole number of seconds, at least 1");
    DEFAULT_TTL_SECS
}

/// A partition count, 1 to [`MAX_PARTITIONS`].
fn partitions(value: &Expr, errors: &mut Errors) -> u32 {
    if let Expr::Lit(ExprLit {
        lit: Lit::Int(i), ..
    }) = value
    {
        match i.base10_parse::<u32>() {
            Ok(n) if (1..=MAX_PARTITIONS).contains(&n) => return n,
            _ => {}
        }
    }
    errors.spanned(
        value,
        format!("`partitions` is a whole number of partitions, 1 to {MAX_PARTITIONS}"),
    );
    1
}

/// The function must be `async fn name(env: TestEnv)`, not generic, without
/// another test attribute.
fn check_fn(func: &ItemFn, errors: &mut Errors) {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.spanned(
            sig.fn_token,
            "#[tenure::test] needs an `async fn` (it runs the body on a tokio runtime)",
        );
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.spanned(
            &sig.generics,
            "a #[tenure::test] function cannot be generic",
        );
    }
    match sig.inputs.len() {
        1 if matches!(sig.inputs.first(), Some(FnArg::Typed(_))) => {}
        1 => errors.spanned(&sig.inputs, "the argument is the test's `TestEnv`, not `self`"),
        0 => errors.at(
            sig.paren_token.span.join(),
            "a #[tenure::test] function takes one argument: `env: tenure::testing::TestEnv`",
        ),
        _ => errors.spanned(
            &sig.inputs,
            "a #[tenure::test] function takes exactly one argument: `env: tenure::testing::TestEnv`",
        ),
    }
    for attr in &func.attrs {
        let last = attr.path().segments.last().map(|s| s.ident.to_string());
        if matches!(last.as_deref(), Some("test")) {
            errors.spanned(
                attr,
                "remove this attribute: #[tenure::test] already makes a #[test]",
            );
        }
    }
}

fn generate(func: &ItemFn, args: &TestArgs) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let name = &sig.ident;
    let inputs = &sig.inputs;
    let output = &sig.output;
    let ttl = args.ttl_secs.unwrap_or(DEFAULT_TTL_SECS);
    let own_stack = args.own_stack;
    let partitions = match args.partitions {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    };
    let worker = match &args.worker {
        Some(p) => quote!(::core::option::Option::Some(|cfg| ::std::boxed::Box::pin(#p(cfg)))),
        None => quote!(::core::option::Option::None),
    };
    let body_fn = syn::Ident::new("__tenure_test_body", Span::call_site());
    quote! {
        #(#attrs)*
        #[::core::prelude::v1::test]
        #vis fn #name() {
            async fn #body_fn(#inputs) #output #block
            ::tenure::testing::__run(
                ::tenure::testing::TestSpec {
                    path: ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name)),
                    ttl_secs: #ttl,
                    own_stack: #own_stack,
                    partitions: #partitions,
                    worker: #worker,
                },
                #body_fn,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(attr: TokenStream, item: TokenStream) -> Vec<String> {
        let mut errors = Errors::default();
        let _ = parse_args(attr, &mut errors);
        if let Ok(f) = syn::parse2::<ItemFn>(item) {
            check_fn(&f, &mut errors);
        }
        errors.messages()
    }

    #[test]
    fn a_well_formed_test_has_no_errors() {
        let e = errors_of(
            quote!(ttl_secs = 3, worker = crate::w, own_stack, partitions = 4),
            quote!(
                async fn t(env: TestEnv) {}
            ),
        );
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn every_problem_is_reported() {
        let e = errors_of(
            quote!(
                ttl_secs = 0,
                colour = 1,
                own_stack,
                own_stack,
                partitions = 0
            ),
            quote!(
                #[test]
                fn t<T>(a: T, b: T) {}
            ),
        );
        assert_eq!(e.len(), 8, "{e:?}");
    }
}
