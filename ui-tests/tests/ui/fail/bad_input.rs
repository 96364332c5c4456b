use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.input")]
impl Job1 {
    #[step]
    async fn borrowed(&self, _ctx: &mut StepCtx, input: &str) -> Result<String, StepError> {
        Ok(input.to_owned())
    }
    #[step]
    async fn generic<T: serde::de::DeserializeOwned>(&self, _ctx: &mut StepCtx, _input: T) -> Result<(), StepError> {
        Ok(())
    }
    #[step]
    async fn opaque(&self, _ctx: &mut StepCtx, _input: impl Send) -> Result<(), StepError> {
        Ok(())
    }
}

fn main() {}
