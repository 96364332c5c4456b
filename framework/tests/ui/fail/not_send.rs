use std::rc::Rc;

use tenure::{StepCtx, StepError};

pub struct Job1;

#[tenure::job(name = "t.send")]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, StepError> {
        let shared = Rc::new(input);
        tokio::task::yield_now().await;
        Ok(*shared)
    }
}

fn main() {}
