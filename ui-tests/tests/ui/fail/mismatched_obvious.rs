use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.obvious")]
impl Job1 {
    #[step]
    async fn split(&self, _ctx: &mut StepCtx, input: u64) -> Result<(u32, u32), StepError> {
        Ok(((input >> 32) as u32, input as u32))
    }
    #[step]
    async fn sum(&self, _ctx: &mut StepCtx, input: u32) -> Result<u64, StepError> {
        Ok(input.into())
    }
    #[step]
    async fn done(&self, _ctx: &mut StepCtx, _input: ()) -> Result<(), StepError> {
        Ok(())
    }
}

fn main() {}
