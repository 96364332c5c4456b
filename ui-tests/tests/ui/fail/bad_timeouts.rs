use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.bad_timeouts", step_timeout = "0s")]
impl Job1 {
    #[step(timeout = "30")]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }

    #[step(on_timeout = "permanent")]
    async fn second(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }

    #[step(timeout = "1s", on_timeout = "sometimes")]
    async fn third(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }

    #[step(timeout = 30)]
    async fn fourth(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
