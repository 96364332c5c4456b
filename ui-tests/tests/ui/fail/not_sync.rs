use std::cell::Cell;

use tenure::{StepCtx, StepError};

pub struct Job1 {
    pub counter: Cell<u32>,
}

#[tenure::job(name = "t.sync")]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
