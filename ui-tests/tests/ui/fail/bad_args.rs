use tenure::{StepCtx, StepError};

pub struct Job1;
pub struct Job2;
pub struct Job3;

#[tenure::job(name = 5, retries = "x", max_takeovers = -1, colour = "red")]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

#[tenure::job(name = "has spaces", retries = "3", name = "again", max_takeovers = 5000000000)]
impl Job2 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

#[tenure::job(name = "t.job3" retries = 3)]
impl Job3 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
