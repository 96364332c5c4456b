use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.dup")]
impl Job1 {
    #[step]
    async fn charge(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
    #[step]
    async fn charge(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input + 1)
    }
}

fn main() {}
