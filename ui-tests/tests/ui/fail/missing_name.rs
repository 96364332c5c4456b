use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(retries = 3)]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
