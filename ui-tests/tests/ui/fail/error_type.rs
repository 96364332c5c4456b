use tenure::StepCtx;

pub struct Job1;

#[tenure::job(name = "t.error")]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, String> {
        Ok(input)
    }
}

fn main() {}
