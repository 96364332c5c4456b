use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.on_dead_signature", on_dead = compensate)]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }

    // Takes the checkpoint instead of a `DeadJob`.
    async fn compensate(&self, _ctx: &mut StepCtx, _checkpoint: u32) -> Result<(), StepError> {
        Ok(())
    }
}

fn main() {}
