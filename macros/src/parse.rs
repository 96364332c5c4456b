//! From the `impl` block under `#[tenure::job]` to a typed [`JobDef`]: find the
//! `#[step]` methods, strip their markers, validate every signature.

use std::collections::HashMap;

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{
    Attribute, FnArg, GenericArgument, GenericParam, Ident, ImplItem, ImplItemFn, ItemImpl, Meta,
    PatType, PathArguments, Receiver, ReturnType, Type,
};

use crate::errors::Errors;

/// The shape every step must have, quoted in error messages.
pub(crate) const SIGNATURE: &str =
    "`async fn name(&self, ctx: &mut StepCtx, input: T) -> Result<U, StepError>`";

/// A job: its type and its steps, in order.
#[derive(Debug)]
pub(crate) struct JobDef {
    /// The type the impl block is for.
    pub(crate) self_ty: Type,
    /// `#[cfg(..)]` attributes of the impl block, repeated on the generated code.
    pub(crate) cfgs: Vec<Attribute>,
    /// The steps in declaration order (never empty).
    pub(crate) steps: Vec<StepDef>,
}

/// One `#[step]` method.
#[derive(Debug)]
pub(crate) struct StepDef {
    /// The method's identifier (possibly raw, `r#type`).
    pub(crate) ident: Ident,
    /// The step's name: the identifier without `r#`.
    pub(crate) name: String,
    /// `T` in `input: T`.
    pub(crate) input: Type,
    /// `U` in `Result<U, E>`.
    pub(crate) output: Type,
    /// `E` in `Result<U, E>`.
    pub(crate) error: Type,
}

/// Strips every `#[step]` marker from `item` (always, so that the impl block can be
/// emitted even when it has errors) and validates the job.
///
/// Returns `None` if no `Job` impl can be generated; the reasons are in `errors`.
pub(crate) fn parse_job(item: &mut ItemImpl, errors: &mut Errors) -> Option<JobDef> {
    let mut fatal = false;

    if let Some((bang, path, for_token)) = &item.trait_ {
        errors.spanned(
            quote!(#bang #path #for_token),
            "#[tenure::job] goes on an inherent impl block (`impl MyJob { .. }`), not on a \
             trait impl: the macro writes `impl tenure::Job for MyJob` itself",
        );
        fatal = true;
    }
    if !item.generics.params.is_empty() {
        errors.spanned(
            &item.generics,
            "#[tenure::job] does not support generic impl blocks: a job type has one stable \
             NAME and one step table; put #[tenure::job] on an impl for a concrete type, \
             e.g. `impl Transfer<HttpClient>`",
        );
        fatal = true;
    } else if let Some(where_clause) = &item.generics.where_clause {
        errors.spanned(
            where_clause,
            "#[tenure::job] does not support `where` clauses on the impl block",
        );
        fatal = true;
    }

    let mut steps: Vec<StepDef> = Vec::new();
    let mut step_errors = false;
    let mut first_index: HashMap<String, usize> = HashMap::new();
    let mut duplicates = Vec::new();
    for (position, impl_item) in item.items.iter_mut().enumerate() {
        let Some(attrs) = attrs_mut(impl_item) else {
            continue;
        };
        let markers = take_step_markers(attrs);
        let Some(marker) = markers.first() else {
            continue;
        };
        let mut ok = true;
        for extra in &markers[1..] {
            errors.spanned(extra, "duplicate #[step] marker");
            ok = false;
        }
        match &marker.meta {
            Meta::Path(_) => {}
            Meta::List(list) => {
                errors.spanned(
                    list,
                    "#[step] takes no arguments: the step's name is the method's name",
                );
                ok = false;
            }
            Meta::NameValue(nv) => {
                errors.spanned(
                    nv,
                    "#[step] takes no arguments: the step's name is the method's name",
                );
                ok = false;
            }
        }
        let ImplItem::Fn(f) = impl_item else {
            let kind = match impl_item {
                ImplItem::Const(_) => "an associated const",
                ImplItem::Type(_) => "an associated type",
                ImplItem::Macro(_) => "a macro invocation",
                _ => "this item",
            };
            errors.spanned(
                marker,
                format!("#[step] goes on a step method, not on {kind}: {SIGNATURE}"),
            );
            step_errors = true;
            continue;
        };
        let step = parse_step(f, errors);
        // The shape of a step is fixed: `async` even when it does not await, and
        // `&mut StepCtx` even when it does not mutate the context.
        f.attrs.push(syn::parse_quote!(
            #[allow(clippy::unused_async, clippy::needless_pass_by_ref_mut)]
        ));
        match step {
            Some(step) if ok => match first_index.get(&step.name) {
                Some(&first) => {
                    errors.spanned(
                        &step.ident,
                        format!(
                            "duplicate step `{}` (already step {first}): a step's name \
                             identifies it in job rows and must be unique within the job",
                            step.name
                        ),
                    );
                    // Report it once, here, rather than also as rustc's E0592.
                    duplicates.push(position);
                }
                None => {
                    first_index.insert(step.name.clone(), steps.len());
                    steps.push(step);
                }
            },
            _ => step_errors = true,
        }
    }
    for position in duplicates.into_iter().rev() {
        item.items.remove(position);
    }

    if steps.is_empty() && !step_errors && !fatal {
        let (impl_token, self_ty) = (&item.impl_token, &item.self_ty);
        errors.spanned(
            quote!(#impl_token #self_ty),
            format!(
                "this job has no steps: mark each step method with #[step], in order; \
                 a step is {SIGNATURE}"
            ),
        );
    }
    if fatal || step_errors || steps.is_empty() {
        return None;
    }
    Some(JobDef {
        self_ty: (*item.self_ty).clone(),
        cfgs: item
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("cfg"))
            .cloned()
            .collect(),
        steps,
    })
}

fn attrs_mut(item: &mut ImplItem) -> Option<&mut Vec<Attribute>> {
    match item {
        ImplItem::Const(c) => Some(&mut c.attrs),
        ImplItem::Fn(f) => Some(&mut f.attrs),
        ImplItem::Type(t) => Some(&mut t.attrs),
        ImplItem::Macro(m) => Some(&mut m.attrs),
        _ => None,
    }
}

/// `#[step]`, `#[tenure::step]` or `#[::tenure::step]`.
pub(crate) fn is_step_marker(attr: &Attribute) -> bool {
    let segments: Vec<String> = attr
        .path()
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    segments == ["step"] || segments == ["tenure", "step"]
}

fn take_step_markers(attrs: &mut Vec<Attribute>) -> Vec<Attribute> {
    let (markers, rest) = std::mem::take(attrs).into_iter().partition(is_step_marker);
    *attrs = rest;
    markers
}

/// Validates one step's signature, reporting every problem.
pub(crate) fn parse_step(f: &ImplItemFn, errors: &mut Errors) -> Option<StepDef> {
    let sig = &f.sig;
    let name = sig.ident.unraw().to_string();
    let mut ok = true;
    let mut fail = |tokens: TokenStream, message: String| {
        errors.spanned(tokens, message);
        ok = false;
    };

    for attr in &f.attrs {
        if attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr") {
            fail(
                quote!(#attr),
                format!(
                    "#[cfg] on step `{name}` is not supported: a job's step list is fixed; \
                     put #[cfg] on the whole impl block or branch inside the step"
                ),
            );
        }
    }
    if let Some(constness) = &sig.constness {
        fail(
            quote!(#constness),
            format!("step `{name}` cannot be a `const fn`: {SIGNATURE}"),
        );
    }
    if sig.asyncness.is_none() {
        let fn_token = &sig.fn_token;
        fail(
            quote!(#fn_token),
            format!("step `{name}` must be an `async fn`: {SIGNATURE}"),
        );
    }
    if let Some(unsafety) = &sig.unsafety {
        fail(
            quote!(#unsafety),
            format!("step `{name}` cannot be `unsafe`"),
        );
    }
    if let Some(abi) = &sig.abi {
        fail(quote!(#abi), format!("step `{name}` cannot have an ABI"));
    }
    for param in &sig.generics.params {
        if !matches!(param, GenericParam::Lifetime(_)) {
            fail(
                quote!(#param),
                format!(
                    "step `{name}` cannot have type or const parameters: its input and \
                     output are decoded from and encoded to checkpoints, so they must be \
                     concrete types"
                ),
            );
        }
    }
    if let Some(variadic) = &sig.variadic {
        fail(
            quote!(#variadic),
            format!("step `{name}` cannot be variadic"),
        );
    }

    // Parameters: `&self`, then `ctx: &mut StepCtx`, then exactly one input.
    let parens = sig.paren_token.span.join();
    let mut receiver: Option<&Receiver> = None;
    let mut typed: Vec<&PatType> = Vec::new();
    for arg in &sig.inputs {
        match arg {
            FnArg::Receiver(r) => receiver = Some(r),
            FnArg::Typed(t) => typed.push(t),
        }
    }
    if sig.inputs.is_empty() {
        fail(
            quote_at(parens),
            format!("step `{name}` has no parameters: {SIGNATURE}"),
        );
    }
    match receiver {
        _ if sig.inputs.is_empty() => {}
        Some(r) if is_shared_self(r) => {}
        Some(r) => fail(
            quote!(#r),
            format!(
                "step `{name}` must take `&self`, not `{}`: one job value serves every \
                 running job of its type; keep mutable state behind a lock or in the \
                 database",
                quote!(#r).to_string().replace("& ", "&")
            ),
        ),
        None => {
            let at = typed
                .first()
                .map_or_else(|| quote_at(parens), |t| quote!(#t));
            fail(
                at,
                format!("step `{name}` must take `&self` first: {SIGNATURE}"),
            );
        }
    }
    let mut input: Option<&Type> = None;
    match typed.as_slice() {
        _ if sig.inputs.is_empty() => {}
        [] => fail(
            quote_at(parens),
            format!(
                "step `{name}` is missing its `ctx: &mut StepCtx` and input parameters: {SIGNATURE}"
            ),
        ),
        [only] => {
            if ctx_problem(&only.ty).is_none() {
                fail(
                    quote!(#only),
                    format!(
                        "step `{name}` is missing its input parameter after `ctx`: {SIGNATURE} \
                         (the first step's input is the job's input; use `()` for none)"
                    ),
                );
            } else {
                fail(
                    quote!(#only),
                    format!(
                        "step `{name}` is missing `ctx: &mut StepCtx` before its input: {SIGNATURE}"
                    ),
                );
            }
        }
        [input_param, ctx, ..]
            if ctx_problem(&input_param.ty).is_some() && ctx_problem(&ctx.ty).is_none() =>
        {
            fail(
                quote!(#input_param, #ctx),
                format!("step `{name}` takes `ctx: &mut StepCtx` before its input: {SIGNATURE}"),
            );
        }
        [ctx, input_param, extra @ ..] => {
            if let Some(problem) = ctx_problem(&ctx.ty) {
                let ty = &ctx.ty;
                fail(
                    quote!(#ty),
                    format!(
                        "the second parameter of step `{name}` must be `ctx: &mut StepCtx`{problem}"
                    ),
                );
            }
            match strip(&input_param.ty) {
                Type::Reference(_) => fail(
                    {
                        let ty = &input_param.ty;
                        quote!(#ty)
                    },
                    format!(
                        "the input of step `{name}` must be an owned type (e.g. `String`, not \
                         `&str`): it is decoded from the previous step's JSON checkpoint"
                    ),
                ),
                Type::ImplTrait(_) => fail(
                    {
                        let ty = &input_param.ty;
                        quote!(#ty)
                    },
                    format!(
                        "the input of step `{name}` cannot be `impl Trait`: it is decoded from \
                         a checkpoint into one concrete type"
                    ),
                ),
                _ => input = Some(&input_param.ty),
            }
            if let (Some(first), Some(last)) = (extra.first(), extra.last()) {
                fail(
                    quote!(#first #last),
                    format!(
                        "step `{name}` takes exactly one input after `ctx`: pass several \
                         values as one tuple or struct (which the previous step returns)"
                    ),
                );
            }
        }
    }

    let mut result = None;
    match &sig.output {
        ReturnType::Default => {
            let ident = &sig.ident;
            fail(
                quote!(#ident),
                format!("step `{name}` must return `Result<U, StepError>`: {SIGNATURE}"),
            );
        }
        ReturnType::Type(_, ty) => match result_args(ty) {
            Some(args) => result = Some(args),
            None => fail(
                quote!(#ty),
                format!(
                    "step `{name}` must return `Result<U, StepError>`, spelled out with both \
                     arguments (the macro cannot see through aliases such as `io::Result<T>`)"
                ),
            ),
        },
    }

    match (ok, input, result) {
        (true, Some(input), Some((output, error))) => Some(StepDef {
            ident: sig.ident.clone(),
            name,
            input: input.clone(),
            output: output.clone(),
            error: error.clone(),
        }),
        _ => None,
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

/// Removes invisible groups and parentheses around a type.
pub(crate) fn strip(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => strip(&g.elem),
        Type::Paren(p) => strip(&p.elem),
        other => other,
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

/// The span to use for generated code about `tokens`: located at them, resolved at
/// the call site (so generated identifiers keep their call-site hygiene).
pub(crate) fn located(tokens: &impl Spanned) -> Span {
    Span::call_site().located_at(tokens.span())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use syn::parse_quote;

    use super::*;

    fn job(mut item: ItemImpl) -> (Option<JobDef>, Vec<String>, ItemImpl) {
        let mut errors = Errors::default();
        let def = parse_job(&mut item, &mut errors);
        (def, errors.messages(), item)
    }

    fn step(f: ImplItemFn) -> (Option<StepDef>, Vec<String>) {
        let mut errors = Errors::default();
        let def = parse_step(&f, &mut errors);
        (def, errors.messages())
    }

    fn s(ty: &Type) -> String {
        quote!(#ty).to_string()
    }

    #[test]
    fn parses_the_transfer_job_and_strips_markers() {
        let (def, errors, item) = job(parse_quote! {
            #[cfg(not(any()))]
            impl Transfer {
                #[step]
                async fn reserve(&self, ctx: &mut StepCtx, input: TransferReq) -> Result<Reserved, StepError> { todo!() }
                #[tenure::step]
                pub async fn debit(&self, ctx: &mut tenure::job::StepCtx, r: Reserved) -> Result<Debited, StepError> { todo!() }
                /// Docs stay.
                #[::tenure::step]
                async fn r#notify(&self, _: &mut StepCtx, Debited { id }: Debited) -> std::result::Result<(), StepError> { todo!() }
                fn helper(&self) {}
                const X: u32 = 1;
            }
        });
        assert!(errors.is_empty(), "{errors:?}");
        let def = def.unwrap();
        assert_eq!(s(&def.self_ty), "Transfer");
        assert_eq!(def.cfgs.len(), 1);
        let names: Vec<_> = def.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["reserve", "debit", "notify"]);
        assert_eq!(s(&def.steps[0].input), "TransferReq");
        assert_eq!(s(&def.steps[0].output), "Reserved");
        assert_eq!(s(&def.steps[1].input), "Reserved");
        assert_eq!(s(&def.steps[2].output), "()");
        assert_eq!(s(&def.steps[2].error), "StepError");
        // Every marker is gone, everything else stays.
        let out = quote!(#item).to_string();
        assert!(!out.contains("step ]"), "{out}");
        assert!(out.contains("Docs stay"));
        assert!(out.contains("fn helper"));
        assert_eq!(item.items.len(), 5);
    }

    #[test]
    fn markers_are_stripped_even_on_errors() {
        let (def, errors, item) = job(parse_quote! {
            impl Transfer {
                #[step] fn a(&self) {}
                #[step] async fn b(&self, ctx: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
            }
        });
        assert!(def.is_none());
        assert!(!errors.is_empty());
        assert!(!quote!(#item).to_string().contains("step"));
    }

    #[test]
    fn rejects_trait_impls_and_generics() {
        let (def, errors, _) = job(parse_quote! {
            impl Clone for Transfer { #[step] async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() } }
        });
        assert!(def.is_none());
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("inherent impl block"));

        let (def, errors, _) = job(parse_quote! {
            impl<C: Client> Transfer<C> { #[step] async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() } }
        });
        assert!(def.is_none());
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("does not support generic impl blocks"));

        // A concrete instantiation is fine.
        let (def, errors, _) = job(parse_quote! {
            impl Transfer<Http> { #[step] async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() } }
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert!(def.is_some());
    }

    #[test]
    fn no_steps() {
        let (def, errors, _) = job(parse_quote! { impl Transfer { fn helper(&self) {} } });
        assert!(def.is_none());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("this job has no steps"));
    }

    #[test]
    fn duplicate_steps_are_reported_and_removed() {
        let (def, errors, item) = job(parse_quote! {
            impl Transfer {
                #[step] async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                #[step] async fn r#a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
            }
        });
        assert!(def.is_some());
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("duplicate step `a` (already step 0)"),
            "{errors:?}"
        );
        assert_eq!(item.items.len(), 1);
    }

    #[test]
    fn marker_problems() {
        let (def, errors, _) = job(parse_quote! {
            impl Transfer {
                #[step(name = "x")] async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                #[step] #[step] async fn b(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                #[step] const C: u32 = 1;
            }
        });
        assert!(def.is_none());
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("#[step] takes no arguments"));
        assert!(errors[1].starts_with("duplicate #[step]"));
        assert!(errors[2].starts_with("#[step] goes on a step method, not on an associated const"));
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
