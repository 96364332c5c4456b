//! One `#[step]` method's signature: sorted into its parts ([`Params`]), each part
//! checked by a small validator that reports every problem it finds, then turned
//! into a [`StepDef`] if none was found.

use std::fmt::Display;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::{
    Attribute, FnArg, GenericArgument, GenericParam, ImplItemFn, PatType, PathArguments, Receiver,
    ReturnType, Signature, Type,
};

use crate::errors::Errors;
use crate::parse::{SIGNATURE, StepDef, strip};

/// Validates one step's signature, reporting every problem.
pub(crate) fn parse_step(f: &ImplItemFn, errors: &mut Errors) -> Option<StepDef> {
    let sig = &f.sig;
    let mut check = Check {
        name: sig.ident.unraw().to_string(),
        report: Report { errors, ok: true },
    };
    check.no_cfg(&f.attrs);
    check.qualifiers(sig);
    check.no_type_params(sig);
    check.not_variadic(sig);
    let params = Params::of(sig);
    check.receiver(&params);
    let input = check.inputs(&params);
    let result = check.output(sig);
    match (check.report.ok, input, result) {
        (true, Some(input), Some((output, error))) => Some(StepDef {
            ident: sig.ident.clone(),
            name: check.name,
            input: input.clone(),
            output: output.clone(),
            error: error.clone(),
            timeout: crate::timeout::StepArgs::default(),
        }),
        _ => None,
    }
}

/// A step's parameters, sorted: its receiver, and its typed parameters in order
/// (`ctx`, the input, any extra).
struct Params<'a> {
    /// The parentheses around the parameters: where a missing one is reported.
    parens: Span,
    /// There are none at all (only that is reported then).
    none: bool,
    receiver: Option<&'a Receiver>,
    typed: Vec<&'a PatType>,
}

impl<'a> Params<'a> {
    fn of(sig: &'a Signature) -> Self {
        let mut params = Params {
            parens: sig.paren_token.span.join(),
            none: sig.inputs.is_empty(),
            receiver: None,
            typed: Vec::new(),
        };
        for arg in &sig.inputs {
            match arg {
                FnArg::Receiver(r) => params.receiver = Some(r),
                FnArg::Typed(t) => params.typed.push(t),
            }
        }
        params
    }
}

/// Where the validators of a step report what they find wrong.
struct Report<'e> {
    errors: &'e mut Errors,
    /// Nothing was reported.
    ok: bool,
}

impl Report<'_> {
    fn fail(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.errors.spanned(tokens, message);
        self.ok = false;
    }
}

/// The validators of one step.
struct Check<'e> {
    /// The step's name, in messages.
    name: String,
    report: Report<'e>,
}

impl Check<'_> {
    /// No `#[cfg]` or `#[cfg_attr]` on the step.
    fn no_cfg(&mut self, attrs: &[Attribute]) {
        let name = &self.name;
        for attr in attrs {
            if attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr") {
                self.report.fail(
                    quote!(#attr),
                    format!(
                        "#[cfg] on step `{name}` is not supported: a job's step list is fixed; \
                         put #[cfg] on the whole impl block or branch inside the step"
                    ),
                );
            }
        }
    }

    /// `async`; not `const`, `unsafe` or `extern`.
    fn qualifiers(&mut self, sig: &Signature) {
        let name = &self.name;
        if let Some(constness) = &sig.constness {
            self.report.fail(
                quote!(#constness),
                format!("step `{name}` cannot be a `const fn`: {SIGNATURE}"),
            );
        }
        if sig.asyncness.is_none() {
            let fn_token = &sig.fn_token;
            self.report.fail(
                quote!(#fn_token),
                format!("step `{name}` must be an `async fn`: {SIGNATURE}"),
            );
        }
        if let Some(unsafety) = &sig.unsafety {
            self.report.fail(
                quote!(#unsafety),
                format!("step `{name}` cannot be `unsafe`"),
            );
        }
        if let Some(abi) = &sig.abi {
            self.report
                .fail(quote!(#abi), format!("step `{name}` cannot have an ABI"));
        }
    }

    /// Lifetime parameters only.
    fn no_type_params(&mut self, sig: &Signature) {
        let name = &self.name;
        for param in &sig.generics.params {
            if !matches!(param, GenericParam::Lifetime(_)) {
                self.report.fail(
                    quote!(#param),
                    format!(
                        "step `{name}` cannot have type or const parameters: its input and \
                         output are decoded from and encoded to checkpoints, so they must be \
                         concrete types"
                    ),
                );
            }
        }
    }

    fn not_variadic(&mut self, sig: &Signature) {
        if let Some(variadic) = &sig.variadic {
            let name = &self.name;
            self.report.fail(
                quote!(#variadic),
                format!("step `{name}` cannot be variadic"),
            );
        }
    }

    /// Some parameters, the first `&self`.
    fn receiver(&mut self, params: &Params<'_>) {
        let name = &self.name;
        if params.none {
            self.report.fail(
                quote_at(params.parens),
                format!("step `{name}` has no parameters: {SIGNATURE}"),
            );
            return;
        }
        match params.receiver {
            Some(r) if is_shared_self(r) => {}
            Some(r) => self.report.fail(
                quote!(#r),
                format!(
                    "step `{name}` must take `&self`, not `{}`: one job value serves every \
                     running job of its type; keep mutable state behind a lock or in the \
                     database",
                    quote!(#r).to_string().replace("& ", "&")
                ),
            ),
            None => {
                let at = params
                    .typed
                    .first()
                    .map_or_else(|| quote_at(params.parens), |t| quote!(#t));
                self.report.fail(
                    at,
                    format!("step `{name}` must take `&self` first: {SIGNATURE}"),
                );
            }
        }
    }

    /// `ctx: &mut StepCtx`, then exactly one input; returns the input's type.
    fn inputs<'a>(&mut self, params: &Params<'a>) -> Option<&'a Type> {
        let name = &self.name;
        match params.typed.as_slice() {
            _ if params.none => None,
            [] => {
                self.report.fail(
                    quote_at(params.parens),
                    format!(
                        "step `{name}` is missing its `ctx: &mut StepCtx` and input parameters: {SIGNATURE}"
                    ),
                );
                None
            }
            [only] => {
                self.lone_param(only);
                None
            }
            [input, ctx, ..]
                if ctx_problem(&input.ty).is_some() && ctx_problem(&ctx.ty).is_none() =>
            {
                self.report.fail(
                    quote!(#input, #ctx),
                    format!(
                        "step `{name}` takes `ctx: &mut StepCtx` before its input: {SIGNATURE}"
                    ),
                );
                None
            }
            [ctx, input, extra @ ..] => {
                self.ctx_param(ctx);
                let input = self.input_param(input);
                self.no_extra_params(extra);
                input
            }
        }
    }

    /// One typed parameter: either `ctx` or the input is missing.
    fn lone_param(&mut self, only: &PatType) {
        let name = &self.name;
        let message = if ctx_problem(&only.ty).is_none() {
            format!(
                "step `{name}` is missing its input parameter after `ctx`: {SIGNATURE} \
                 (the first step's input is the job's input; use `()` for none)"
            )
        } else {
            format!("step `{name}` is missing `ctx: &mut StepCtx` before its input: {SIGNATURE}")
        };
        self.report.fail(quote!(#only), message);
    }

    /// The second parameter is `ctx: &mut StepCtx`.
    fn ctx_param(&mut self, ctx: &PatType) {
        if let Some(problem) = ctx_problem(&ctx.ty) {
            let (name, ty) = (&self.name, &ctx.ty);
            self.report.fail(
                quote!(#ty),
                format!(
                    "the second parameter of step `{name}` must be `ctx: &mut StepCtx`{problem}"
                ),
            );
        }
    }

    /// The input is an owned, concrete type; returns it if so.
    fn input_param<'a>(&mut self, input: &'a PatType) -> Option<&'a Type> {
        let name = &self.name;
        let ty = &input.ty;
        match strip(ty) {
            Type::Reference(_) => self.report.fail(
                quote!(#ty),
                format!(
                    "the input of step `{name}` must be an owned type (e.g. `String`, not \
                     `&str`): it is decoded from the previous step's JSON checkpoint"
                ),
            ),
            Type::ImplTrait(_) => self.report.fail(
                quote!(#ty),
                format!(
                    "the input of step `{name}` cannot be `impl Trait`: it is decoded from \
                     a checkpoint into one concrete type"
                ),
            ),
            _ => return Some(ty),
        }
        None
    }

    /// Nothing after the input.
    fn no_extra_params(&mut self, extra: &[&PatType]) {
        if let (Some(first), Some(last)) = (extra.first(), extra.last()) {
            let name = &self.name;
            self.report.fail(
                quote!(#first #last),
                format!(
                    "step `{name}` takes exactly one input after `ctx`: pass several \
                     values as one tuple or struct (which the previous step returns)"
                ),
            );
        }
    }

    /// `-> Result<U, E>`; returns `(U, E)`.
    fn output<'a>(&mut self, sig: &'a Signature) -> Option<(&'a Type, &'a Type)> {
        let name = &self.name;
        match &sig.output {
            ReturnType::Default => {
                let ident = &sig.ident;
                self.report.fail(
                    quote!(#ident),
                    format!("step `{name}` must return `Result<U, StepError>`: {SIGNATURE}"),
                );
                None
            }
            ReturnType::Type(_, ty) => {
                let args = result_args(ty);
                if args.is_none() {
                    self.report.fail(
                        quote!(#ty),
                        format!(
                            "step `{name}` must return `Result<U, StepError>`, spelled out with \
                             both arguments (the macro cannot see through aliases such as \
                             `io::Result<T>`)"
                        ),
                    );
                }
                args
            }
        }
    }
}

/// Tokens whose span is `span` (for `Errors::spanned`).
fn quote_at(span: Span) -> TokenStream {
    quote::quote_spanned!(span=> ())
}

/// `&self`, `&'a self` or `self: &Self`.
fn is_shared_self(r: &Receiver) -> bool {
    match strip(&r.ty) {
        Type::Reference(reference) => {
            reference.mutability.is_none()
                && matches!(strip(&reference.elem), Type::Path(p) if p.qself.is_none() && p.path.is_ident("Self"))
        }
        _ => false,
    }
}

/// `None` if `ty` is `&mut StepCtx` (any path ending in `StepCtx`), else what is wrong.
fn ctx_problem(ty: &Type) -> Option<&'static str> {
    let is_step_ctx = |ty: &Type| matches!(strip(ty), Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "StepCtx" && s.arguments.is_none()));
    match strip(ty) {
        Type::Reference(r) if is_step_ctx(&r.elem) => {
            if r.mutability.is_some() {
                None
            } else {
                Some(", not `&StepCtx`")
            }
        }
        other if is_step_ctx(other) => Some(" (a mutable borrow), not `StepCtx` by value"),
        _ => Some(""),
    }
}

/// `(U, E)` from `Result<U, E>` (any path ending in `Result`).
fn result_args(ty: &Type) -> Option<(&Type, &Type)> {
    let Type::Path(p) = strip(ty) else {
        return None;
    };
    if p.qself.is_some() {
        return None;
    }
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(Some(ok)), Some(Some(err)), None) => Some((ok, err)),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use syn::parse_quote;

    use super::*;

    fn step(f: ImplItemFn) -> (Option<StepDef>, Vec<String>) {
        let mut errors = Errors::default();
        let def = parse_step(&f, &mut errors);
        (def, errors.messages())
    }

    #[test]
    fn accepted_signatures() {
        for f in [
            parse_quote! { async fn a(&self, ctx: &mut StepCtx, x: u32) -> Result<u32, StepError> {} },
            parse_quote! { pub async fn a<'x>(&'x self, ctx: &'x mut crate::StepCtx, mut x: u32) -> core::result::Result<(u8, u8), E> {} },
            parse_quote! { async fn a(self: &Self, _: &mut (StepCtx), _: Vec<u8>) -> Result<(), StepError> {} },
        ] {
            let (def, errors) = step(f);
            assert!(errors.is_empty(), "{errors:?}");
            assert!(def.is_some());
        }
    }

    #[test]
    fn every_signature_problem_is_reported() {
        let (def, errors) = step(parse_quote! {
            const unsafe extern "C" fn a<T>(&mut self, ctx: &StepCtx, x: &str, y: u8, z: u8) {}
        });
        assert!(def.is_none());
        let expected = [
            "cannot be a `const fn`",
            "must be an `async fn`",
            "cannot be `unsafe`",
            "cannot have an ABI",
            "cannot have type or const parameters",
            "must take `&self`, not `&mut self`",
            "must be `ctx: &mut StepCtx`, not `&StepCtx`",
            "must be an owned type",
            "takes exactly one input after `ctx`",
            "must return `Result<U, StepError>`",
        ];
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        for (e, want) in errors.iter().zip(expected) {
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
    }

    #[test]
    fn parameter_counting() {
        let cases: [(ImplItemFn, &str); 7] = [
            (
                parse_quote! { async fn a() -> Result<(), E> {} },
                "has no parameters",
            ),
            (
                parse_quote! { async fn a(&self) -> Result<(), E> {} },
                "missing its `ctx: &mut StepCtx` and input",
            ),
            (
                parse_quote! { async fn a(&self, c: &mut StepCtx) -> Result<(), E> {} },
                "missing its input parameter",
            ),
            (
                parse_quote! { async fn a(&self, x: u32) -> Result<(), E> {} },
                "missing `ctx: &mut StepCtx` before its input",
            ),
            (
                parse_quote! { async fn a(self, c: &mut StepCtx, x: u32) -> Result<(), E> {} },
                "not `self`",
            ),
            (
                parse_quote! { async fn a(&self, c: StepCtx, x: u32) -> Result<(), E> {} },
                "not `StepCtx` by value",
            ),
            (
                parse_quote! { async fn a(&self, c: &mut Ctx, x: u32) -> Result<(), E> {} },
                "must be `ctx: &mut StepCtx`",
            ),
        ];
        for (f, want) in cases {
            let (def, errors) = step(f);
            assert!(def.is_none());
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(
                errors[0].contains(want),
                "{:?} should contain {want:?}",
                errors[0]
            );
        }
        // A missing `&self` does not shift the other checks.
        let (_, errors) =
            step(parse_quote! { async fn a(c: &mut StepCtx, x: u32) -> Result<(), E> {} });
        assert_eq!(errors.len(), 1, "{errors:?}");
    }

    #[test]
    fn return_types() {
        for (f, ok) in [
            (
                parse_quote! { async fn a(&self, c: &mut StepCtx, x: u32) -> io::Result<u32> {} },
                false,
            ),
            (
                parse_quote! { async fn a(&self, c: &mut StepCtx, x: u32) -> Option<u32> {} },
                false,
            ),
            (
                parse_quote! { async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, E, F> {} },
                false,
            ),
            (
                parse_quote! { async fn a(&self, c: &mut StepCtx, x: u32) -> impl Future {} },
                false,
            ),
            (
                parse_quote! { async fn a(&self, c: &mut StepCtx, x: u32) -> my::Result<u32, E> {} },
                true,
            ),
        ] {
            let f: ImplItemFn = f;
            let (def, errors) = step(f);
            assert_eq!(def.is_some(), ok, "{errors:?}");
        }
    }

    #[test]
    fn cfg_on_steps_is_rejected() {
        let (def, errors) = step(parse_quote! {
            #[cfg(feature = "x")]
            async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> {}
        });
        assert!(def.is_none());
        assert!(errors[0].contains("#[cfg] on step `a` is not supported"));
    }
}
