use tenure::{StepCtx, StepError};

pub struct Job1<C> {
    pub client: C,
}

#[tenure::job(name = "t.generic")]
impl<C: Send + Sync + 'static> Job1<C> {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        Ok(input)
    }
}

fn main() {}
