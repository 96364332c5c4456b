use tenure::{DeadJob, Job, StepCtx, StepError};

pub struct Transfer;

#[tenure::job(name = "t.on_dead", on_dead = refund)]
impl Transfer {
    #[step]
    async fn debit(&self, _ctx: &mut StepCtx, cents: i64) -> Result<i64, StepError> {
        Ok(cents)
    }

    async fn refund(&self, _ctx: &mut StepCtx, dead: DeadJob) -> Result<(), StepError> {
        let _debited: Option<i64> = dead.checkpoint_as()?;
        Ok(())
    }
}

pub struct Plain;

#[tenure::job(name = "t.plain")]
impl Plain {
    #[step]
    async fn only(&self, _ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

pub fn main() {
    assert!(<Transfer as Job>::ON_DEAD);
    assert!(!<Plain as Job>::ON_DEAD);
}
