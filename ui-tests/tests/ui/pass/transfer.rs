//! The job from the design document, as a user writes it.

// Generated code must not warn in user crates.
#![deny(warnings)]

use serde::{Deserialize, Serialize};
use tenure::{Job, StepCtx, StepError};

#[derive(Serialize, Deserialize)]
pub struct TransferReq {
    pub from: String,
    pub to: String,
    pub cents: u64,
}
#[derive(Serialize, Deserialize)]
pub struct Reserved {
    pub hold: u64,
}
#[derive(Serialize, Deserialize)]
pub struct Debited {
    pub entry: u64,
}

pub struct Transfer {
    pub fee: u64,
}

#[tenure::job(name = "ledger.transfer", max_takeovers = 5, retries = 3)]
impl Transfer {
    #[step]
    async fn reserve(&self, _ctx: &mut StepCtx, input: TransferReq) -> Result<Reserved, StepError> {
        Ok(Reserved {
            hold: input.cents + self.fee,
        })
    }
    #[step]
    async fn debit(&self, _ctx: &mut StepCtx, r: Reserved) -> Result<Debited, StepError> {
        Ok(Debited { entry: r.hold })
    }
    #[step]
    async fn notify(&self, _ctx: &mut StepCtx, _d: Debited) -> Result<(), StepError> {
        Ok(())
    }
    fn helper(&self) -> u64 {
        self.fee
    }
}

fn assert_job<J: Job<Input = TransferReq, Output = ()>>() {}

pub fn main() {
    assert_job::<Transfer>();
    assert_eq!(Transfer::NAME, "ledger.transfer");
    let names: Vec<_> = Transfer::STEPS.iter().map(|s| s.name).collect();
    assert_eq!(names, ["reserve", "debit", "notify"]);
    assert_eq!(Transfer::MAX_TAKEOVERS, Some(5));
    assert_eq!(Transfer::RETRIES, Some(3));
    assert_eq!(Transfer { fee: 2 }.helper(), 2);
}
