use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.not_async")]
impl Job1 {
    #[step]
    fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
