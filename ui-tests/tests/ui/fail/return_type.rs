use tenure::StepCtx;

pub struct Job1;

#[tenure::job(name = "t.returns")]
impl Job1 {
    #[step]
    async fn nothing(&self, _ctx: &mut StepCtx, _input: u32) {}
    #[step]
    async fn alias(&self, _ctx: &mut StepCtx, input: u32) -> std::io::Result<u32> {
        Ok(input)
    }
    #[step]
    async fn option(&self, _ctx: &mut StepCtx, input: u32) -> Option<u32> {
        Some(input)
    }
}

fn main() {}
