//! Entry points of `#[job]` and `#[step]`, and code generation from a [`JobDef`].
//!
//! The generated code is the hand-written `Job` impl shown in the docs of
//! `tenure::Job`, inside `const _: () = { .. };`, with absolute paths only.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::{Ident, Item, Type};

use crate::args::{JobArgs, parse_args};
use crate::chain::{Relation, relate};
use crate::errors::Errors;
use crate::parse::{JobDef, StepDef, located, parse_job};

/// `#[tenure::job(..)]` on `item`.
///
/// Emits the impl block (minus the `#[step]` markers), the `Job` impl when the steps
/// allow one, and one `compile_error!` per problem found.
pub(crate) fn job(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let args = parse_args(attr, &mut errors);
    let mut item = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Impl(item)) => item,
        Ok(other) => {
            not_an_impl(&other, &mut errors);
            let errors = errors.to_compile_errors();
            return quote!(#other #errors);
        }
        Err(e) => {
            errors.push(e);
            let errors = errors.to_compile_errors();
            return quote!(#item #errors);
        }
    };
    let generated = parse_job(&mut item, &mut errors).map(|def| generate(&def, &args, &mut errors));
    let errors = errors.to_compile_errors();
    quote! {
        #item
        #generated
        #errors
    }
}

/// `#[tenure::step]` on its own: a `#[job]` impl block strips these markers, so
/// reaching this means the marker is not inside one.
pub(crate) fn step(_attr: TokenStream, item: TokenStream) -> TokenStream {
    let error = syn::Error::new(
        Span::call_site(),
        "#[step] only marks a method inside an impl block annotated with \
         #[tenure::job(name = \"...\")]; write it as `#[step]` or `#[tenure::step]` there",
    )
    .to_compile_error();
    quote!(#item #error)
}

fn not_an_impl(item: &Item, errors: &mut Errors) {
    let (found, head) = match item {
        Item::Struct(s) => {
            let (kw, ident) = (&s.struct_token, &s.ident);
            ("a struct", quote!(#kw #ident))
        }
        Item::Enum(e) => {
            let (kw, ident) = (&e.enum_token, &e.ident);
            ("an enum", quote!(#kw #ident))
        }
        Item::Fn(f) => {
            let (kw, ident) = (&f.sig.fn_token, &f.sig.ident);
            ("a function", quote!(#kw #ident))
        }
        Item::Trait(t) => {
            let (kw, ident) = (&t.trait_token, &t.ident);
            ("a trait", quote!(#kw #ident))
        }
        Item::Mod(m) => {
            let (kw, ident) = (&m.mod_token, &m.ident);
            ("a module", quote!(#kw #ident))
        }
        other => ("this item", quote!(#other)),
    };
    errors.spanned(
        head,
        format!(
            "#[tenure::job] goes on the impl block that holds the job's steps, not on {found}: \
             `#[tenure::job(name = \"...\")] impl MyJob {{ #[step] async fn first(..) .. }}`"
        ),
    );
}

/// The `Job` impl (and the type-continuity checks) for `def`.
pub(crate) fn generate(def: &JobDef, args: &JobArgs, errors: &mut Errors) -> TokenStream {
    // `parse_job` guarantees at least one step.
    let (Some(first), Some(last)) = (def.steps.first(), def.steps.last()) else {
        return TokenStream::new();
    };
    let cfgs = &def.cfgs;
    let chain = chain_checks(&def.steps, errors);
    let chain_items = &chain.items;
    let into_step_error = into_step_error();
    let job_impl = job_impl(def, args, &first.input, &last.output, &chain.calls);
    quote! {
        #(#cfgs)*
        const _: () = {
            #(#chain_items)*

            #into_step_error

            #job_impl
        };
    }
}

/// `impl ::tenure::Job for MyJob`, from the job's input type (the first step's)
/// to its output type (the last step's); `chain_calls` are the calls of the
/// type-continuity checks.
fn job_impl(
    def: &JobDef,
    args: &JobArgs,
    input_ty: &Type,
    output_ty: &Type,
    chain_calls: &[TokenStream],
) -> TokenStream {
    let self_ty = &def.self_ty;
    // A missing name was reported already; generate with a placeholder so that code
    // using `MyJob: Job` does not pile further errors on top.
    let name = args.name.as_deref().unwrap_or("");
    let step_infos = def.steps.iter().map(|s| {
        let name = &s.name;
        quote!(::tenure::job::StepInfo { name: #name })
    });
    let max_takeovers = option_u32(args.max_takeovers);
    let retries = option_u32(args.retries);
    let on_dead = args.on_dead.as_ref().map(on_dead);
    let timeouts: Vec<_> = def.steps.iter().map(|s| s.timeout).collect();
    let step_timeouts = crate::timeout::step_timeouts(&timeouts, args.step_timeout_ms);
    let run_step = run_step(&def.steps, chain_calls);
    quote! {
        #[automatically_derived]
        impl ::tenure::Job for #self_ty {
            type Input = #input_ty;
            type Output = #output_ty;
            const NAME: &'static ::core::primitive::str = #name;
            const STEPS: &'static [::tenure::job::StepInfo] = &[#(#step_infos),*];
            const MAX_TAKEOVERS: ::core::option::Option<::core::primitive::u32> = #max_takeovers;
            const RETRIES: ::core::option::Option<::core::primitive::u32> = #retries;
            #step_timeouts
            #on_dead

            #run_step
        }
    }
}

/// `Some(n)` or `None`, with absolute paths.
fn option_u32(v: Option<u32>) -> TokenStream {
    match v {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    }
}

/// `ON_DEAD` and `on_dead`, calling the hook `hook` of the impl block.
fn on_dead(hook: &Ident) -> TokenStream {
    // The hook is called as a method of the impl block, located at its name:
    // an unknown method or a wrong signature is reported there by rustc.
    let call = quote_spanned!(located(hook)=> Self::#hook(self, ctx, dead));
    quote! {
        const ON_DEAD: ::core::primitive::bool = true;

        fn on_dead<'__tenure>(
            &'__tenure self,
            ctx: &'__tenure mut ::tenure::job::StepCtx,
            dead: ::tenure::job::DeadJob,
        ) -> ::tenure::job::BoxFuture<
            '__tenure,
            ::core::result::Result<(), ::tenure::job::StepError>,
        > {
            ::std::boxed::Box::pin(#call)
        }
    }
}

/// The trait behind `?` on a step's result, with an error that names the step's
/// error type.
fn into_step_error() -> TokenStream {
    quote! {
        #[diagnostic::on_unimplemented(
            message = "the error type of a step must convert into `tenure::StepError`; `{Self}` does not",
            label = "use `StepError`, an error type that implements `std::error::Error + Send + Sync + 'static`, `anyhow::Error` or `Box<dyn Error + Send + Sync>`"
        )]
        trait __TenureIntoStepError {
            fn __tenure_into_step_error(self) -> ::tenure::job::StepError;
        }
        impl<E> __TenureIntoStepError for E
        where
            ::tenure::job::StepError: ::core::convert::From<E>,
        {
            fn __tenure_into_step_error(self) -> ::tenure::job::StepError {
                ::core::convert::From::from(self)
            }
        }
    }
}

/// The type-continuity checks of a job: items (a trait and a function per pair of
/// steps only rustc can compare) and the calls that make rustc check them.
#[derive(Default)]
struct ChainChecks {
    items: Vec<TokenStream>,
    calls: Vec<TokenStream>,
}

/// Step k + 1 must take what step k returns. Same spelling: nothing to check.
/// Certainly different: report now. Otherwise: a trait bound rustc checks, with
/// a message naming both steps.
fn chain_checks(steps: &[StepDef], errors: &mut Errors) -> ChainChecks {
    let mut checks = ChainChecks::default();
    for (k, pair) in steps.windows(2).enumerate() {
        let [prev, next] = pair else { continue };
        match relate(&prev.output, &next.input) {
            Relation::Same => {}
            Relation::Different => report_mismatch(prev, next, errors),
            Relation::Unknown => {
                let (item, call) = chain_check(k + 1, prev, next);
                checks.items.push(item);
                checks.calls.push(call);
            }
        }
    }
    checks
}

/// Reports that step `next` cannot take what step `prev` returns.
fn report_mismatch(prev: &StepDef, next: &StepDef, errors: &mut Errors) {
    let (prev_out, next_in) = (&prev.output, &next.input);
    errors.spanned(
        next_in,
        format!(
            "step `{}` takes `{}`, but the previous step `{}` returns `{}`: each \
             step's input type must be the previous step's output type",
            next.name,
            quote!(#next_in),
            prev.name,
            quote!(#prev_out),
        ),
    );
}

/// The check that step `k` (`next`) takes what step `k - 1` (`prev`) returns: a
/// trait bound with a message naming both steps, and its call, located at `next`'s
/// input type.
fn chain_check(k: usize, prev: &StepDef, next: &StepDef) -> (TokenStream, TokenStream) {
    let (prev_out, next_in) = (&prev.output, &next.input);
    let bound = format_ident!("__TenureInputOfStep{}", k);
    let check = format_ident!("__tenure_input_of_step_{}", k);
    let message = format!(
        "step `{}` takes `{{Self}}`, but the previous step `{}` returns `{{Prev}}`",
        next.name, prev.name
    );
    let label = format!("expected `{{Prev}}`, the output of step `{}`", prev.name);
    let note = format!(
        "each step's input is the previous step's output: `{}` returns \
         `Result<{{Prev}}, _>`, so `{}` must take `input: {{Prev}}`",
        prev.name, next.name
    );
    let item = quote! {
        #[diagnostic::on_unimplemented(message = #message, label = #label, note = #note)]
        trait #bound<Prev: ?::core::marker::Sized> {}
        impl<T: ?::core::marker::Sized> #bound<T> for T {}
        fn #check<Input, Prev>()
        where
            Input: ?::core::marker::Sized + #bound<Prev>,
            Prev: ?::core::marker::Sized,
        {
        }
    };
    let call = quote_spanned!(located(next_in)=> #check::<#next_in, #prev_out>(););
    (item, call)
}

/// `fn run_step`: the chain checks, then one match arm per step.
fn run_step(steps: &[StepDef], chain_calls: &[TokenStream]) -> TokenStream {
    let arms = steps.iter().enumerate().map(|(i, s)| run_step_arm(i, s));
    quote! {
        fn run_step<'__tenure>(
            &'__tenure self,
            step: ::tenure::StepIndex,
            ctx: &'__tenure mut ::tenure::job::StepCtx,
            input: ::tenure::__private::serde_json::Value,
        ) -> ::tenure::job::BoxFuture<
            '__tenure,
            ::core::result::Result<::tenure::__private::serde_json::Value, ::tenure::job::StepError>,
        > {
            #(#chain_calls)*
            match step.get() {
                #(#arms)*
                _ => ::std::boxed::Box::pin(::core::future::ready(::core::result::Result::Err(
                    ::tenure::job::StepError::no_such_step::<Self>(step),
                ))),
            }
        }
    }
}

/// The match arm of step `i`: decode its input, call it, encode its output.
fn run_step_arm(i: usize, s: &StepDef) -> TokenStream {
    let index = u32::try_from(i).unwrap_or(u32::MAX);
    let (ident, input, output) = (&s.ident, &s.input, &s.output);
    // One boxed future per step, located at the step's name: a step whose
    // future is not `Send` is reported there. A decode/encode bound failure
    // points at the user's type, a failed error conversion at the error type.
    let decode = quote_spanned!(located(input)=>
        ::tenure::job::decode_checkpoint::<#input>(step, input)?
    );
    let call = quote_spanned!(located(ident)=> Self::#ident(self, ctx, input).await);
    let error_ty = &s.error;
    let convert = quote_spanned!(located(error_ty)=>
        <#error_ty as __TenureIntoStepError>::__tenure_into_step_error(error)
    );
    let encode = quote_spanned!(located(output)=>
        ::tenure::job::encode_checkpoint::<#output>(step, &output)
    );
    quote_spanned! {located(ident)=>
        #index => ::std::boxed::Box::pin(async move {
            let input = #decode;
            let output = match #call {
                ::core::result::Result::Ok(output) => output,
                ::core::result::Result::Err(error) => return ::core::result::Result::Err(#convert),
            };
            #encode
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn expand(attr: TokenStream, item: TokenStream) -> (String, syn::File) {
        let out = job(attr, item);
        let file: syn::File = syn::parse2(out.clone()).unwrap();
        (out.to_string(), file)
    }

    fn compile_errors(out: &str) -> Vec<String> {
        out.split("compile_error ! {")
            .skip(1)
            .map(|s| s.split('}').next().unwrap_or_default().trim().to_owned())
            .collect()
    }

    const TRANSFER: &str = r#"
        impl Transfer {
            #[step]
            async fn reserve(&self, ctx: &mut StepCtx, input: TransferReq) -> Result<Reserved, StepError> { todo!() }
            #[step]
            async fn debit(&self, ctx: &mut StepCtx, r: Reserved) -> Result<model::Debited, StepError> { todo!() }
            #[step]
            async fn notify(&self, ctx: &mut StepCtx, d: Debited) -> Result<(), StepError> { todo!() }
            fn helper(&self) {}
        }
    "#;

    #[test]
    fn expands_the_transfer_job() {
        let (out, file) = expand(
            quote!(name = "ledger.transfer", max_takeovers = 5, retries = 3),
            TRANSFER.parse().unwrap(),
        );
        assert!(compile_errors(&out).is_empty(), "{out}");
        // The impl block, then `const _: () = { .. };`.
        assert_eq!(file.items.len(), 2, "{out}");
        assert!(
            matches!(&file.items[0], Item::Impl(i) if i.trait_.is_none() && i.items.len() == 4)
        );
        let Item::Const(c) = &file.items[1] else {
            panic!("{out}")
        };
        assert_eq!(c.ident, "_");
        for needle in [
            "impl :: tenure :: Job for Transfer",
            "type Input = TransferReq ;",
            "type Output = () ;",
            "const NAME : & 'static :: core :: primitive :: str = \"ledger.transfer\" ;",
            "StepInfo { name : \"reserve\" } , :: tenure :: job :: StepInfo { name : \"debit\" } , :: tenure :: job :: StepInfo { name : \"notify\" }",
            "Option :: Some (5u32)",
            "Option :: Some (3u32)",
            "0u32 => :: std :: boxed :: Box :: pin (async move {",
            "decode_checkpoint :: < TransferReq > (step , input) ?",
            "match Self :: reserve (self , ctx , input) . await {",
            "< StepError as __TenureIntoStepError > :: __tenure_into_step_error (error)",
            "encode_checkpoint :: < () > (step , & output)",
            "2u32 =>",
            "no_such_step :: < Self > (step)",
        ] {
            assert!(out.contains(needle), "missing {needle:?} in\n{out}");
        }
        // reserve -> debit spelled the same: no check. debit -> notify: left to rustc.
        assert!(!out.contains("__TenureInputOfStep1"), "{out}");
        assert!(
            out.contains("__tenure_input_of_step_2 :: < Debited , model :: Debited > ()"),
            "{out}"
        );
        assert!(out.contains(
            "step `notify` takes `{Self}`, but the previous step `debit` returns `{Prev}`"
        ));
    }

    #[test]
    fn optional_arguments_default_to_none() {
        let (out, _) = expand(quote!(name = "t"), TRANSFER.parse().unwrap());
        assert!(out.contains("MAX_TAKEOVERS : :: core :: option :: Option < :: core :: primitive :: u32 > = :: core :: option :: Option :: None"));
        assert!(out.contains("RETRIES : :: core :: option :: Option < :: core :: primitive :: u32 > = :: core :: option :: Option :: None"));
    }

    #[test]
    fn errors_are_collected_and_the_impl_is_kept() {
        let (out, file) = expand(
            quote!(retries = "x"),
            quote! {
                impl Transfer {
                    #[step] fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                    #[step] async fn b(&mut self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                    fn helper(&self) {}
                }
            },
        );
        let errors = compile_errors(&out);
        assert_eq!(errors.len(), 4, "{errors:#?}");
        assert!(errors[0].contains("`retries` must be an integer literal"));
        assert!(errors[1].contains("missing `name"));
        assert!(errors[2].contains("step `a` must be an `async fn`"));
        assert!(errors[3].contains("step `b` must take `&self`"));
        // The user's impl stays (so its other uses still resolve); no Job impl.
        assert!(matches!(&file.items[0], Item::Impl(i) if i.items.len() == 3));
        assert!(!out.contains(":: tenure :: Job"));
    }

    #[test]
    fn certainly_mismatched_types_get_a_custom_error() {
        let (out, _) = expand(
            quote!(name = "t"),
            quote! {
                impl Transfer {
                    #[step] async fn a(&self, c: &mut StepCtx, x: u32) -> Result<(u32, u32), StepError> { todo!() }
                    #[step] async fn b(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                }
            },
        );
        let errors = compile_errors(&out);
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(
            errors[0]
                .contains("step `b` takes `u32`, but the previous step `a` returns `(u32 , u32)`"),
            "{errors:?}"
        );
        assert!(!out.contains("__TenureInputOfStep"));
    }

    #[test]
    fn not_an_impl() {
        let (out, file) = expand(
            quote!(name = "t"),
            quote!(
                pub struct Transfer;
            ),
        );
        let errors = compile_errors(&out);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("not on a struct"), "{errors:?}");
        assert!(matches!(&file.items[0], Item::Struct(_)));
    }

    #[test]
    fn cfg_on_the_impl_is_repeated() {
        let (out, _) = expand(
            quote!(name = "t"),
            quote! {
                #[cfg(feature = "ledger")]
                impl Transfer {
                    #[step] async fn a(&self, c: &mut StepCtx, x: u32) -> Result<u32, StepError> { todo!() }
                }
            },
        );
        assert_eq!(
            out.matches("# [cfg (feature = \"ledger\")]").count(),
            2,
            "{out}"
        );
    }

    #[test]
    fn a_lone_step_marker_is_an_error() {
        let out = step(
            TokenStream::new(),
            quote!(
                async fn a() {}
            ),
        );
        let out = out.to_string();
        assert!(out.starts_with("async fn a"));
        assert!(out.contains("#[step] only marks a method inside"));
    }
}
