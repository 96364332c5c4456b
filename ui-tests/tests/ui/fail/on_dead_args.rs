use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.on_dead_args", on_dead = "compensate")]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

pub struct Job2;

#[tenure::job(name = "t.on_dead_args2", on_dead)]
impl Job2 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
