use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.receiver")]
impl Job1 {
    #[step]
    async fn by_mut_ref(&mut self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
    #[step]
    async fn by_value(self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
    #[step]
    async fn associated(_ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
