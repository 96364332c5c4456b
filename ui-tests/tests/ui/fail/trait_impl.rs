use tenure::{StepCtx, StepError};

pub struct Job1;

pub trait Steps {
    async fn first(&self, ctx: &mut StepCtx, input: u32) -> Result<u32, StepError>;
}

#[tenure::job(name = "t.trait")]
impl Steps for Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
