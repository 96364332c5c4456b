//! From the `impl` block under `#[tenure::job]` to a typed [`JobDef`]: find the
//! `#[step]` methods, strip their markers, validate every signature.

use std::collections::HashMap;

use proc_macro2::Span;
use quote::quote;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, ImplItem, ItemImpl, Type};

use crate::errors::Errors;
use crate::signature::parse_step;
use crate::timeout::{StepArgs, parse_step_args};

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
    /// Its timeout, from the `#[step(..)]` marker.
    pub(crate) timeout: StepArgs,
}

/// Strips every `#[step]` marker from `item` (always, so that the impl block can be
/// emitted even when it has errors) and validates the job.
///
/// Returns `None` if no `Job` impl can be generated; the reasons are in `errors`.
pub(crate) fn parse_job(item: &mut ItemImpl, errors: &mut Errors) -> Option<JobDef> {
    let fatal = check_impl_block(item, errors);
    let steps = collect_steps(item, errors);
    if steps.defs.is_empty() && !steps.failed && !fatal {
        let (impl_token, self_ty) = (&item.impl_token, &item.self_ty);
        errors.spanned(
            quote!(#impl_token #self_ty),
            format!(
                "this job has no steps: mark each step method with #[step], in order; \
                 a step is {SIGNATURE}"
            ),
        );
    }
    if fatal || steps.failed || steps.defs.is_empty() {
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
        steps: steps.defs,
    })
}

/// An inherent impl block without generics; returns whether it is not (reported).
fn check_impl_block(item: &ItemImpl, errors: &mut Errors) -> bool {
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
    fatal
}

/// The `#[step]` methods of an impl block, in order.
#[derive(Default)]
struct Steps {
    /// The valid steps, without duplicates.
    defs: Vec<StepDef>,
    /// A step's name -> its index in `defs`.
    index: HashMap<String, usize>,
    /// Positions in the impl block of the duplicate steps (removed afterwards).
    duplicates: Vec<usize>,
    /// A marker or a step had a problem (reported).
    failed: bool,
}

impl Steps {
    /// Adds `step`, found at `position` in the impl block, unless its name is taken.
    fn add(&mut self, position: usize, step: StepDef, errors: &mut Errors) {
        match self.index.get(&step.name) {
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
                self.duplicates.push(position);
            }
            None => {
                self.index.insert(step.name.clone(), self.defs.len());
                self.defs.push(step);
            }
        }
    }
}

/// Finds, unmarks and validates every `#[step]` item; removes duplicate steps.
fn collect_steps(item: &mut ItemImpl, errors: &mut Errors) -> Steps {
    let mut steps = Steps::default();
    for (position, impl_item) in item.items.iter_mut().enumerate() {
        let Some(attrs) = attrs_mut(impl_item) else {
            continue;
        };
        let markers = take_step_markers(attrs);
        let Some(marker) = markers.first() else {
            continue;
        };
        let step_args = check_markers(&markers, errors);
        let ImplItem::Fn(f) = impl_item else {
            not_a_method(impl_item, marker, errors);
            steps.failed = true;
            continue;
        };
        let step = parse_step(f, errors);
        // The shape of a step is fixed: `async` even when it does not await, and
        // `&mut StepCtx` even when it does not mutate the context.
        f.attrs.push(syn::parse_quote!(
            #[allow(clippy::unused_async, clippy::needless_pass_by_ref_mut)]
        ));
        match (step, step_args) {
            (Some(step), Some(timeout)) => steps.add(position, StepDef { timeout, ..step }, errors),
            _ => steps.failed = true,
        }
    }
    for &position in steps.duplicates.iter().rev() {
        item.items.remove(position);
    }
    steps
}

/// The arguments of the one `#[step]` marker, or `None` when it is repeated or
/// its arguments are wrong (reported).
fn check_markers(markers: &[Attribute], errors: &mut Errors) -> Option<StepArgs> {
    let mut ok = true;
    for extra in markers.iter().skip(1) {
        errors.spanned(extra, "duplicate #[step] marker");
        ok = false;
    }
    let args = parse_step_args(markers.first()?, errors)?;
    if args.permanent.is_some() && args.timeout_ms.is_none() {
        errors.spanned(
            markers.first()?,
            "`on_timeout` needs this step's own `timeout = \"..\"` beside it",
        );
        return None;
    }
    ok.then_some(args)
}

/// Reports a `#[step]` marker on something else than a method.
fn not_a_method(impl_item: &ImplItem, marker: &Attribute, errors: &mut Errors) {
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

/// Removes invisible groups and parentheses around a type.
pub(crate) fn strip(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => strip(&g.elem),
        Type::Paren(p) => strip(&p.elem),
        other => other,
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
        assert!(
            errors[0].starts_with("unknown argument: #[step] takes `timeout"),
            "{errors:?}"
        );
        assert!(errors[1].starts_with("duplicate #[step]"));
        assert!(errors[2].starts_with("#[step] goes on a step method, not on an associated const"));
    }

    #[test]
    fn timeout_arguments() {
        let (def, errors, _) = job(parse_quote! {
            impl Transfer {
                #[step(timeout = "30s")] async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                #[step(timeout = "1h", on_timeout = "permanent")] async fn b(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                #[step] async fn c(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
            }
        });
        assert!(errors.is_empty(), "{errors:?}");
        let t: Vec<_> = def.unwrap().steps.iter().map(|s| s.timeout).collect();
        assert_eq!(t[0].timeout_ms, Some(30_000));
        assert_eq!(
            (t[1].timeout_ms, t[1].permanent),
            (Some(3_600_000), Some(true))
        );
        assert_eq!(t[2], StepArgs::default());
    }

    #[test]
    fn timeout_problems() {
        let (def, errors, _) = job(parse_quote! {
            impl Transfer {
                #[step(timeout = "30")] async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                #[step(on_timeout = "permanent")] async fn b(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                #[step(timeout = "1s", timeout = "2s")] async fn c(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                #[step(on_timeout = "never", timeout = 5)] async fn d(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
            }
        });
        assert!(def.is_none());
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(
            errors[0].starts_with("`timeout` has no unit it knows"),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("`on_timeout` needs this step's own `timeout"),
            "{errors:?}"
        );
        assert!(errors[2].starts_with("duplicate argument"), "{errors:?}");
        assert!(
            errors[3].starts_with("`on_timeout` is \"retryable\""),
            "{errors:?}"
        );
        assert!(
            errors[4].starts_with("expected a string literal"),
            "{errors:?}"
        );
    }
}
