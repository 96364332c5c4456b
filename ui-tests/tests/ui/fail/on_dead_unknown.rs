use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.on_dead_unknown", on_dead = compensat)]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }

    async fn compensate(&self, _ctx: &mut StepCtx, _dead: tenure::DeadJob) -> Result<(), StepError> {
        Ok(())
    }
}

fn main() {}
