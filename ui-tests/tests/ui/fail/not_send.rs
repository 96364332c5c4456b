use std::rc::Rc;

use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.send")]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        tokio::task::yield_now().await;
        Ok(input)
    }
    // Holds an `Rc` across an await: only this step is reported.
    #[step]
    async fn second(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        let shared = Rc::new(input);
        tokio::task::yield_now().await;
        Ok(*shared)
    }
}

fn main() {}
