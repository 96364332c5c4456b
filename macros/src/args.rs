//! The arguments of `#[tenure::job(name = "...", max_takeovers = N, retries = N)]`.

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Lit, LitStr, Meta, Token};

use crate::errors::Errors;

/// The arguments, validated. Missing or invalid ones are `None` (and reported).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct JobArgs {
    /// `name = "ledger.transfer"`.
    pub(crate) name: Option<String>,
    /// `max_takeovers = 5`.
    pub(crate) max_takeovers: Option<u32>,
    /// `retries = 3`.
    pub(crate) retries: Option<u32>,
    /// `on_dead = compensate`: a method of the job's impl block.
    pub(crate) on_dead: Option<syn::Ident>,
    /// `step_timeout = "30s"`: every step's timeout unless it has its own, in
    /// milliseconds.
    pub(crate) step_timeout_ms: Option<u64>,
}

const KNOWN: &str = "expected `name = \"...\"`, `max_takeovers = N`, `retries = N`, \
                     `on_dead = method` or `step_timeout = \"30s\"`";

/// Parses the attribute's arguments, reporting every problem into `errors`.
pub(crate) fn parse_args(attr: TokenStream, errors: &mut Errors) -> JobArgs {
    let mut args = JobArgs::default();
    let Some(metas) = parse_metas(attr, errors) else {
        // Do not also complain that `name` is missing: we could not read it.
        return args;
    };
    let mut seen = Vec::new();
    for meta in &metas {
        parse_arg(meta, &mut seen, &mut args, errors);
    }
    if !seen.contains(&Arg::Name) {
        errors.at(
            Span::call_site(),
            "missing `name = \"...\"`: every job type needs a stable name, stored in job \
             rows and message headers, e.g. #[tenure::job(name = \"ledger.transfer\")]",
        );
    }
    args
}

/// The comma-separated `key = value` list, or `None` (reported) if it is not one.
fn parse_metas(attr: TokenStream, errors: &mut Errors) -> Option<Punctuated<Meta, Token![,]>> {
    match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr) {
        Ok(metas) => Some(metas),
        Err(e) => {
            errors.push(syn::Error::new(
                e.span(),
                format!(
                    "{e} (the arguments of #[tenure::job] are `name = \"...\"`, \
                     `max_takeovers = N`, `retries = N`, `on_dead = method` and \
                     `step_timeout = \"30s\"`, separated by commas)"
                ),
            ));
            None
        }
    }
}

/// One argument into `args`, unless it is unknown, repeated (`seen` holds the keys
/// met so far) or malformed: then it is reported.
fn parse_arg(meta: &Meta, seen: &mut Vec<Arg>, args: &mut JobArgs, errors: &mut Errors) {
    let Some(arg) = Arg::of(meta, errors) else {
        return;
    };
    let key = arg.key();
    if seen.contains(&arg) {
        errors.spanned(meta.path(), format!("duplicate argument `{key}`"));
        return;
    }
    seen.push(arg);
    let Some(value) = value_of(meta, arg, errors) else {
        return;
    };
    match arg {
        Arg::Name => args.name = parse_name(value, errors),
        Arg::MaxTakeovers => args.max_takeovers = parse_count(key, value, errors),
        Arg::Retries => args.retries = parse_count(key, value, errors),
        Arg::OnDead => args.on_dead = parse_hook(value, errors),
        Arg::StepTimeout => args.step_timeout_ms = parse_timeout(value, errors),
    }
}

/// The arguments `#[tenure::job]` knows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arg {
    Name,
    MaxTakeovers,
    Retries,
    OnDead,
    StepTimeout,
}

impl Arg {
    /// The argument `meta` is, or `None` (reported) if it is not one of ours.
    fn of(meta: &Meta, errors: &mut Errors) -> Option<Arg> {
        let key = meta.path().get_ident().map(ToString::to_string);
        let known = match key.as_deref() {
            Some("name") => Some(Arg::Name),
            Some("max_takeovers") => Some(Arg::MaxTakeovers),
            Some("retries") => Some(Arg::Retries),
            Some("on_dead") => Some(Arg::OnDead),
            Some("step_timeout") => Some(Arg::StepTimeout),
            _ => None,
        };
        if known.is_none() {
            let path = meta.path();
            let shown = quote::quote!(#path).to_string().replace(' ', "");
            errors.spanned(path, format!("unknown argument `{shown}`: {KNOWN}"));
        }
        known
    }

    fn key(self) -> &'static str {
        match self {
            Arg::Name => "name",
            Arg::MaxTakeovers => "max_takeovers",
            Arg::Retries => "retries",
            Arg::OnDead => "on_dead",
            Arg::StepTimeout => "step_timeout",
        }
    }

    /// How the argument is written, for error messages.
    fn example(self) -> String {
        let key = self.key();
        match self {
            Arg::Name => "`name = \"ledger.transfer\"`".to_owned(),
            Arg::MaxTakeovers | Arg::Retries => format!("`{key} = 3`"),
            Arg::OnDead => "`on_dead = compensate`".to_owned(),
            Arg::StepTimeout => "`step_timeout = \"30s\"`".to_owned(),
        }
    }
}

/// The value of `key = value`, or `None` (reported) for `key` or `key(..)`.
fn value_of<'a>(meta: &'a Meta, arg: Arg, errors: &mut Errors) -> Option<&'a Expr> {
    let key = arg.key();
    match meta {
        Meta::NameValue(nv) => Some(&nv.value),
        Meta::Path(p) => {
            errors.spanned(p, format!("`{key}` needs a value: {}", arg.example()));
            None
        }
        Meta::List(l) => {
            errors.spanned(l, format!("write `{key}` as {}", arg.example()));
            None
        }
    }
}

/// `name = "..."`: a string literal holding a valid job name.
fn parse_name(value: &Expr, errors: &mut Errors) -> Option<String> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => validate_name(s).map_err(|e| errors.push(e)).ok(),
        other => {
            errors.spanned(
                other,
                "`name` must be a string literal, e.g. `name = \"ledger.transfer\"`",
            );
            None
        }
    }
}

/// `step_timeout = "30s"`: a string literal holding a duration.
fn parse_timeout(value: &Expr, errors: &mut Errors) -> Option<u64> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => crate::timeout::parse_duration("step_timeout", s, errors),
        other => {
            errors.spanned(
                other,
                "`step_timeout` must be a string literal, e.g. `step_timeout = \"30s\"`",
            );
            None
        }
    }
}

/// `on_dead = method`: a bare identifier.
fn parse_hook(value: &Expr, errors: &mut Errors) -> Option<syn::Ident> {
    match value {
        Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
            p.path.get_ident().cloned()
        }
        other => {
            errors.spanned(
                other,
                "`on_dead` must name a method of this impl block, e.g. \
                 `on_dead = compensate` for `async fn compensate(&self, ctx: &mut StepCtx, \
                 dead: tenure::DeadJob) -> Result<(), StepError>`",
            );
            None
        }
    }
}

fn parse_count(key: &str, value: &Expr, errors: &mut Errors) -> Option<u32> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => match i.suffix() {
            "" | "u32" => match i.base10_parse::<u32>() {
                Ok(n) => Some(n),
                Err(e) => {
                    errors.spanned(i, format!("`{key}` must fit in a u32: {e}"));
                    None
                }
            },
            suffix => {
                errors.spanned(i, format!("`{key}` is a u32; remove the `{suffix}` suffix"));
                None
            }
        },
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => {
            errors.spanned(
                s,
                format!(
                    "`{key}` must be an integer literal, not a string: `{key} = {}`",
                    if s.value().trim().parse::<u32>().is_ok() {
                        s.value().trim().to_owned()
                    } else {
                        "3".to_owned()
                    }
                ),
            );
            None
        }
        other => {
            errors.spanned(
                other,
                format!("`{key}` must be a non-negative integer literal, e.g. `{key} = 3`"),
            );
            None
        }
    }
}

/// Job names end up in job rows, message headers and (possibly) NATS subjects:
/// non-empty, ASCII letters, digits, `_` and `-`, in `.`-separated non-empty parts.
fn validate_name(lit: &LitStr) -> syn::Result<String> {
    let name = lit.value();
    let parts_ok = !name.is_empty()
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        });
    if parts_ok {
        Ok(name)
    } else {
        Err(syn::Error::new_spanned(
            lit,
            format!(
                "invalid job name {name:?}: use ASCII letters, digits, `_` and `-` in \
                 non-empty parts separated by `.`, e.g. \"ledger.transfer\""
            ),
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use quote::quote;

    use super::*;

    fn parse(attr: TokenStream) -> (JobArgs, Vec<String>) {
        let mut errors = Errors::default();
        let args = parse_args(attr, &mut errors);
        (args, errors.messages())
    }

    #[test]
    fn all_arguments() {
        let (args, errors) = parse(quote!(
            name = "ledger.transfer",
            max_takeovers = 5,
            retries = 3,
            step_timeout = "2m",
        ));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            args,
            JobArgs {
                name: Some("ledger.transfer".into()),
                max_takeovers: Some(5),
                retries: Some(3),
                on_dead: None,
                step_timeout_ms: Some(120_000),
            }
        );
    }

    #[test]
    fn only_name() {
        let (args, errors) = parse(quote!(name = "a"));
        assert!(errors.is_empty());
        assert_eq!(args.name.as_deref(), Some("a"));
        assert_eq!((args.max_takeovers, args.retries), (None, None));
    }

    #[test]
    fn missing_name() {
        let (_, errors) = parse(quote!(retries = 3));
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("missing `name"), "{errors:?}");
        let (_, errors) = parse(quote!());
        assert!(errors[0].starts_with("missing `name"), "{errors:?}");
    }

    #[test]
    fn every_error_is_reported() {
        let (args, errors) = parse(quote!(
            name = 5,
            retries = "x",
            max_takeovers = -1,
            colour = "red",
            retries = 2,
        ));
        assert_eq!(args, JobArgs::default());
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(errors[0].contains("`name` must be a string literal"));
        assert!(errors[1].contains("`retries` must be an integer literal, not a string"));
        assert!(errors[2].contains("non-negative integer literal"));
        assert!(errors[3].contains("unknown argument `colour`"));
        assert!(errors[4].contains("duplicate argument `retries`"));
    }

    #[test]
    fn string_number_suggests_the_number() {
        let (_, errors) = parse(quote!(name = "a", retries = "4"));
        assert!(errors[0].contains("`retries = 4`"), "{errors:?}");
    }

    #[test]
    fn out_of_range_and_suffixes() {
        let (_, errors) = parse(quote!(
            name = "a",
            retries = 4294967296,
            max_takeovers = 3u8
        ));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("must fit in a u32"));
        assert!(errors[1].contains("remove the `u8` suffix"));
        let (args, errors) = parse(quote!(name = "a", retries = 4294967295u32));
        assert!(errors.is_empty());
        assert_eq!(args.retries, Some(u32::MAX));
    }

    #[test]
    fn value_less_and_list_forms() {
        let (_, errors) = parse(quote!(name, retries(3)));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("`name` needs a value"));
        assert!(errors[1].contains("write `retries` as `retries = 3`"));
    }

    #[test]
    fn unparsable_arguments_are_one_error() {
        let (_, errors) = parse(quote!(name = ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("the arguments of #[tenure::job]"));
    }

    #[test]
    fn names() {
        for ok in ["a", "ledger.transfer", "a-b_c.D9"] {
            assert!(
                validate_name(&LitStr::new(ok, Span::call_site())).is_ok(),
                "{ok}"
            );
        }
        for bad in ["", ".a", "a.", "a..b", "a b", "a*", "a>", "ä", "a/b"] {
            assert!(
                validate_name(&LitStr::new(bad, Span::call_site())).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn on_dead_names_a_method() {
        let (args, errors) = parse(quote!(name = "a", on_dead = compensate));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            args.on_dead.map(|i| i.to_string()).as_deref(),
            Some("compensate")
        );
        let (args, errors) = parse(quote!(name = "a", on_dead = "compensate", on_dead = x));
        assert_eq!(args.on_dead, None);
        assert!(
            errors[0].contains("`on_dead` must name a method"),
            "{errors:?}"
        );
        assert!(
            errors[1].contains("duplicate argument `on_dead`"),
            "{errors:?}"
        );
        let (_, errors) = parse(quote!(name = "a", on_dead));
        assert!(errors[0].contains("`on_dead = compensate`"), "{errors:?}");
    }
}
