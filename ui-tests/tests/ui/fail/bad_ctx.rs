use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.ctx")]
impl Job1 {
    #[step]
    async fn shared(&self, _ctx: &StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
    #[step]
    async fn owned(&self, _ctx: StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
    #[step]
    async fn swapped(&self, input: u32, _ctx: &mut StepCtx) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
