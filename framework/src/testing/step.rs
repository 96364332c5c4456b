//! [`TestEnv::run_step`]: one step of a job, run by the test itself in a real
//! fenced transaction on the test's database, under a real token (an etcd
//! revision of the test's namespace, newer than every lock before it).

use super::env::{TestEnv, TestError};
use crate::fence::FencedTx;
use crate::job::StepCtx;
use crate::{FencingToken, Job, JobId, StepIndex};

impl TestEnv {
    /// Runs step `k` of job `id` (enqueued as `J`) with `job`, as an owner
    /// would: claims the job's fence under a fresh token, runs the step with a
    /// `StepCtx` whose [`StepCtx::db`] is the step's fenced transaction, and
    /// commits the step's writes together with its checkpoint. Returns the
    /// step's output (JSON). The job's row must be at step `k` (steps before it
    /// committed). The row stays `running` under this token: a worker that
    /// takes the job afterwards counts a takeover.
    ///
    /// # Errors
    /// [`TestError::Step`] when the row is elsewhere, the claim is refused,
    /// or the step fails (its writes roll back).
    pub async fn run_step<J: Job>(
        &self,
        job: &J,
        id: JobId,
        k: StepIndex,
    ) -> Result<serde_json::Value, TestError> {
        let store = self.client().store().clone();
        let token = self.fresh_token(id).await?;
        let (claim, tx) = store.claim_and_begin(id, token).await.map_err(step_error)?;
        if claim.step != k {
            let _ = tx.rollback().await;
            return Err(TestError::Step(format!(
                "job {id} is at step {}, not {k}",
                claim.step
            )));
        }
        let input = match k.get() {
            0 => claim.input.clone(),
            _ => claim.checkpoint.clone().unwrap_or(serde_json::Value::Null),
        };
        let name = J::STEPS.get(k.get() as usize).map_or("?", |s| s.name);
        let mut ctx = StepCtx::detached_with_input(id, k, token, claim.input);
        ctx.job_type = J::NAME;
        ctx.step_name = name;
        ctx.store = Some(store.clone());
        ctx.tx = Some(tx);
        let out = match job.run_step(k, &mut ctx, input).await {
            Ok(out) => out,
            Err(e) => {
                if let Some(tx) = ctx.tx.take() {
                    let _ = tx.rollback().await;
                }
                return Err(TestError::Step(format!(
                    "step {k} ({name}): {}",
                    e.message()
                )));
            }
        };
        let tx: FencedTx = match ctx.tx.take() {
            Some(tx) => tx,
            None => store.begin_step(id, token, k).await.map_err(step_error)?,
        };
        let last = k.get() as usize + 1 == J::STEPS.len();
        tx.commit_step(&out, last).await.map_err(step_error)?;
        self.history().record_commit(id, k, token.get());
        Ok(out)
    }

    /// A token newer than every lock of the namespace so far: the revision
    /// of a put into the test's etcd prefix (what a lock's create revision is).
    async fn fresh_token(&self, id: JobId) -> Result<FencingToken, TestError> {
        let cfg = self.config();
        let mut etcd = etcd_client::Client::connect(cfg.etcd_endpoints.clone(), None)
            .await
            .map_err(|e| TestError::Step(format!("etcd: {e}")))?;
        let key = format!("{}/tenure-kit/run_step/{id}", cfg.namespace);
        let put = etcd
            .put(key, "", None)
            .await
            .map_err(|e| TestError::Step(format!("etcd: {e}")))?;
        let revision = put.header().map_or(0, |h| h.revision());
        Ok(FencingToken::for_tests(revision))
    }
}

fn step_error(e: crate::fence::FenceError) -> TestError {
    TestError::Step(e.to_string())
}
