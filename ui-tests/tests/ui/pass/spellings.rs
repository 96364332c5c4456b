//! Every accepted way of writing a job: paths ending in `StepCtx` and `Result`,
//! error types that convert into `StepError`, raw identifiers, lifetimes,
//! `self: &Self`, one step, the same type spelled differently, other attributes.

// Generated code must not warn in user crates.
#![deny(warnings)]

use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};
use tenure::Job;

pub mod model {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct Reserved(pub u32);
}
use model::Reserved;
type Hold = Reserved;

/// A job with shared, interior-mutable state.
pub struct Spellings {
    calls: AtomicU32,
}

#[tenure::job(name = "t.spellings-1_a")]
#[allow(clippy::unused_async)]
impl Spellings {
    /// Doc comments and other attributes on steps are kept.
    #[tenure::step]
    #[inline]
    pub async fn r#type(
        &self,
        ctx: &mut tenure::job::StepCtx,
        input: (),
    ) -> std::result::Result<Reserved, tenure::StepError> {
        let _ = (input, ctx.step());
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(Reserved(1))
    }

    // Same type, spelled differently: checked by rustc, accepted.
    #[step]
    async fn io<'c>(
        self: &Self,
        _: &'c mut tenure::StepCtx,
        Reserved(n): model::Reserved,
    ) -> Result<Hold, std::io::Error> {
        Ok(Reserved(n + 1))
    }

    #[::tenure::step]
    async fn custom(
        &self,
        _ctx: &mut tenure::StepCtx,
        r: self::Hold,
    ) -> core::result::Result<Vec<(u8, String)>, std::num::ParseIntError> {
        let n: u8 = "1".parse()?;
        Ok(vec![(n, r.0.to_string())])
    }

    #[step]
    async fn last(
        &self,
        _ctx: &mut tenure::StepCtx,
        v: Vec<(u8, String)>,
    ) -> Result<Out, tenure::StepError> {
        Ok(Out { n: v.len() })
    }

    fn helper(&self) -> u32 {
        self.calls.load(Ordering::Relaxed)
    }
}

#[derive(Serialize, Deserialize)]
pub struct Out {
    n: usize,
}

pub struct One;

#[tenure::job(name = "t.one", retries = 0)]
impl One {
    #[step]
    async fn only(
        &self,
        _ctx: &mut tenure::StepCtx,
        input: String,
    ) -> Result<String, tenure::StepError> {
        Ok(input)
    }
}

fn assert_job<J: Job<Input = I, Output = O>, I, O>() {}

pub fn main() {
    assert_job::<Spellings, (), Out>();
    assert_job::<One, String, String>();
    let names: Vec<_> = Spellings::STEPS.iter().map(|s| s.name).collect();
    assert_eq!(names, ["type", "io", "custom", "last"]);
    assert_eq!(One::RETRIES, Some(0));
    assert_eq!(One::MAX_TAKEOVERS, None);
    assert_eq!(
        Spellings {
            calls: AtomicU32::new(0)
        }
        .helper(),
        0
    );
}
