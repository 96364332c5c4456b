use serde::{Deserialize, Serialize};
use tenure::{StepCtx, StepError};

#[derive(Serialize, Deserialize)]
pub struct TransferReq;
#[derive(Serialize, Deserialize)]
pub struct Reserved;
#[derive(Serialize, Deserialize)]
pub struct Debited;

pub struct Transfer;

#[tenure::job(name = "ledger.transfer")]
impl Transfer {
    #[step]
    async fn reserve(&self, _ctx: &mut StepCtx, _input: TransferReq) -> Result<Reserved, StepError> {
        Ok(Reserved)
    }
    // Forgot `debit`: `notify` takes a `Debited` but `reserve` returns a `Reserved`.
    #[step]
    async fn notify(&self, _ctx: &mut StepCtx, _d: Debited) -> Result<(), StepError> {
        Ok(())
    }
}

fn main() {}
