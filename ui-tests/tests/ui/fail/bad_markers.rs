use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.markers")]
impl Job1 {
    #[step(name = "other")]
    async fn renamed(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
    #[step]
    const LIMIT: u32 = 3;
    #[cfg(test)]
    #[step]
    async fn optional(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
