use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.params")]
impl Job1 {
    #[step]
    async fn no_input(&self, _ctx: &mut StepCtx) -> Result<u32, StepError> {
        Ok(1)
    }
    #[step]
    async fn no_ctx(&self, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
    #[step]
    async fn two_inputs(&self, _ctx: &mut StepCtx, a: u32, b: u32) -> Result<u32, StepError> {
        Ok(a + b)
    }
    #[step]
    async fn nothing() -> Result<u32, StepError> {
        Ok(1)
    }
}

fn main() {}
