use tenure::{StepCtx, StepError};

pub struct Job1;

// No #[tenure::job] on the impl block.
impl Job1 {
    #[tenure::step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
