use serde::Serialize;
use tenure::{StepCtx, StepError};

#[derive(Serialize)]
pub struct Request; // not Deserialize: cannot be read back from a checkpoint
pub struct Receipt; // not Serialize: cannot be checkpointed

pub struct Job1;

#[tenure::job(name = "t.serde")]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, _input: u32) -> Result<Request, StepError> {
        Ok(Request)
    }
    #[step]
    async fn second(&self, _ctx: &mut StepCtx, _input: Request) -> Result<Receipt, StepError> {
        Ok(Receipt)
    }
    #[step]
    async fn third(&self, _ctx: &mut StepCtx, _input: Receipt) -> Result<(), StepError> {
        Ok(())
    }
}

fn main() {}
