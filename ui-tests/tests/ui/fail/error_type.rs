use tenure::StepCtx;

/// Not an error: no `std::error::Error`, no conversion into a boxed error.
#[derive(Debug)]
pub struct NotAnError;

pub struct Job1;

#[tenure::job(name = "t.error")]
impl Job1 {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, input: u32) -> Result<u32, NotAnError> {
        Ok(input)
    }
}

fn main() {}
