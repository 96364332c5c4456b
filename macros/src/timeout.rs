//! Step timeouts: the arguments of `#[step(timeout = "30s", on_timeout =
//! "permanent")]`, the job's `step_timeout = "30s"`, and the durations they
//! are written in.

use proc_macro2::TokenStream;
use quote::quote;
use syn::punctuated::Punctuated;
use syn::{Attribute, Expr, ExprLit, Lit, LitStr, Meta, Token};

use crate::errors::Errors;

/// What a `#[step(..)]` marker says of the step's timeout.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepArgs {
    /// `timeout = "30s"`, in milliseconds.
    pub(crate) timeout_ms: Option<u64>,
    /// `on_timeout = "permanent"` (`true`) or `"retryable"` (`false`).
    pub(crate) permanent: Option<bool>,
}

const STEP_ARGS: &str = "#[step] takes `timeout = \"30s\"` and `on_timeout = \"retryable\"` or \
                         `\"permanent\"`; the step's name is the method's name";

/// The arguments of a `#[step(..)]` marker (none for a bare `#[step]`);
/// `None` when one is wrong (reported).
pub(crate) fn parse_step_args(marker: &Attribute, errors: &mut Errors) -> Option<StepArgs> {
    let list = match &marker.meta {
        Meta::Path(_) => return Some(StepArgs::default()),
        Meta::List(list) => list,
        Meta::NameValue(nv) => {
            errors.spanned(nv, STEP_ARGS);
            return None;
        }
    };
    let metas = match list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) {
        Ok(metas) => metas,
        Err(e) => {
            errors.push(syn::Error::new(e.span(), format!("{e}: {STEP_ARGS}")));
            return None;
        }
    };
    let before = errors.len();
    let mut args = StepArgs::default();
    for meta in &metas {
        step_arg(meta, &mut args, errors);
    }
    (errors.len() == before).then_some(args)
}

/// One `key = "value"` of a `#[step(..)]` marker into `args`.
fn step_arg(meta: &Meta, args: &mut StepArgs, errors: &mut Errors) {
    let key = meta.path().get_ident().map(ToString::to_string);
    let Some(value) = string_value(meta, errors) else {
        return;
    };
    let repeated = match key.as_deref() {
        Some("timeout") => args.timeout_ms.replace(0).is_some(),
        Some("on_timeout") => args.permanent.replace(false).is_some(),
        _ => {
            errors.spanned(meta.path(), format!("unknown argument: {STEP_ARGS}"));
            return;
        }
    };
    if repeated {
        errors.spanned(meta.path(), "duplicate argument");
        return;
    }
    match key.as_deref() {
        Some("timeout") => args.timeout_ms = parse_duration("timeout", value, errors),
        _ => args.permanent = parse_on_timeout(value, errors),
    }
}

/// The string literal of `key = "..."`, or `None` (reported).
fn string_value<'a>(meta: &'a Meta, errors: &mut Errors) -> Option<&'a LitStr> {
    match meta {
        Meta::NameValue(nv) => match &nv.value {
            Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) => Some(s),
            other => {
                errors.spanned(other, "expected a string literal, e.g. \"30s\"");
                None
            }
        },
        other => {
            errors.spanned(other, STEP_ARGS);
            None
        }
    }
}

fn parse_on_timeout(value: &LitStr, errors: &mut Errors) -> Option<bool> {
    match value.value().as_str() {
        "retryable" => Some(false),
        "permanent" => Some(true),
        _ => {
            errors.spanned(
                value,
                "`on_timeout` is \"retryable\" (the default: the attempt fails and is \
                 retried) or \"permanent\" (the job is dead-lettered)",
            );
            None
        }
    }
}

/// A duration written `"500ms"`, `"30s"`, `"2m"` or `"1h"`, above zero, in
/// milliseconds; `None` (reported at `value`) otherwise.
pub(crate) fn parse_duration(key: &str, value: &LitStr, errors: &mut Errors) -> Option<u64> {
    match duration_ms(&value.value()) {
        Ok(ms) => Some(ms),
        Err(why) => {
            errors.spanned(
                value,
                format!(
                    "`{key}` {why}: write a whole number and a unit, e.g. \"500ms\", \
                     \"30s\", \"2m\" or \"1h\""
                ),
            );
            None
        }
    }
}

fn duration_ms(text: &str) -> Result<u64, &'static str> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let scale: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err("has no unit it knows"),
    };
    let n: u64 = number.parse().map_err(|_| "has no number")?;
    match n.checked_mul(scale) {
        Some(0) => Err("must be above zero"),
        Some(ms) => Ok(ms),
        None => Err("is too long"),
    }
}

/// `const STEP_TIMEOUTS` of the job's `impl Job`: each step's own timeout,
/// else the job's default; nothing when no step has one.
pub(crate) fn step_timeouts(steps: &[StepArgs], default_ms: Option<u64>) -> TokenStream {
    if default_ms.is_none() && steps.iter().all(|s| s.timeout_ms.is_none()) {
        return TokenStream::new();
    }
    let entries = steps.iter().map(|s| {
        let Some(ms) = s.timeout_ms.or(default_ms) else {
            return quote!(::core::option::Option::None);
        };
        let ctor = if s.permanent == Some(true) {
            quote!(permanent)
        } else {
            quote!(retryable)
        };
        quote!(::core::option::Option::Some(::tenure::job::StepTimeout::#ctor(
            ::core::time::Duration::from_millis(#ms)
        )))
    });
    quote! {
        const STEP_TIMEOUTS: &'static [::core::option::Option<::tenure::job::StepTimeout>] =
            &[#(#entries),*];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_number_and_a_unit() {
        assert_eq!(duration_ms("500ms"), Ok(500));
        assert_eq!(duration_ms("30s"), Ok(30_000));
        assert_eq!(duration_ms("2m"), Ok(120_000));
        assert_eq!(duration_ms("1h"), Ok(3_600_000));
        assert_eq!(duration_ms("0s"), Err("must be above zero"));
        assert_eq!(duration_ms("30"), Err("has no unit it knows"));
        assert_eq!(duration_ms("1.5s"), Err("has no unit it knows"));
        assert_eq!(duration_ms("s"), Err("has no number"));
        assert_eq!(duration_ms("99999999999999999h"), Err("is too long"));
    }
}
