//! [`TestEnv::run_step`]: one step of a job, run by the test itself as a real
//! owner: a session of its own in etcd, the job's lock (its token), the claim
//! and the step's fenced transaction on the test's database.

use super::env::TestEnv;
use super::spec::TestError;
use crate::fence::FencedTx;
use crate::job::StepCtx;
use crate::lease::{Acquire, Campaign, Session};
use crate::{FencingToken, Job, JobId, StepIndex};

impl TestEnv {
    /// Runs step `k` of job `id` (enqueued as `J`) with `job`, as an owner
    /// would: establishes a session (worker id `run_step`), acquires the
    /// job's lock (its token; in partition mode it owns the job's partition
    /// instead, so no worker may own it then), claims the job's fence, runs the step with a
    /// `StepCtx` whose [`StepCtx::db`] is the step's fenced transaction, and
    /// commits the step's writes together with its checkpoint. Returns the
    /// step's output (JSON), then closes the session (deleting the lock). The
    /// job's row must be at step `k` (steps before it committed). The row
    /// stays `running` under this token, not released: a worker that takes
    /// the job afterwards counts a takeover.
    ///
    /// # Errors
    /// [`TestError::Step`] when a worker holds the job's lock, the row is
    /// elsewhere, the claim is refused, or the step fails (its writes roll
    /// back).
    pub async fn run_step<J: Job>(
        &self,
        job: &J,
        id: JobId,
        k: StepIndex,
    ) -> Result<serde_json::Value, TestError> {
        let cfg = self.config().clone().with_worker_id("run_step");
        let session = Session::establish(&cfg)
            .await
            .map_err(|e| TestError::Step(format!("etcd session: {e}")))?;
        let result = self.run_step_as_owner(&session, job, id, k).await;
        let _ = session.close().await;
        result
    }

    /// [`TestEnv::run_step`] under `session`.
    async fn run_step_as_owner<J: Job>(
        &self,
        session: &Session,
        job: &J,
        id: JobId,
        k: StepIndex,
    ) -> Result<serde_json::Value, TestError> {
        let store = self.client().store().clone();
        let token = match self.config().partitions {
            Some(p) => self.own_partition::<J>(session, id, p).await?,
            None => match session.acquire(id).await {
                Ok(Acquire::Acquired(lock)) => lock.token(),
                Ok(Acquire::Contended { holder }) => {
                    let held = format!("job {id}'s lock is held by lease {holder:?}");
                    return Err(TestError::Step(held));
                }
                Err(e) => return Err(TestError::Step(format!("job lock: {e}"))),
            },
        };
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
}

impl TestEnv {
    /// Partition mode: owns the job's partition under `session` (its key in
    /// etcd, then its fence in PostgreSQL), as a worker would; its token.
    async fn own_partition<J: Job>(
        &self,
        session: &Session,
        id: JobId,
        partitions: u32,
    ) -> Result<FencingToken, TestError> {
        let p = id.partition(partitions);
        let lead = match session.own_partition(J::NAME, p).await {
            Ok(Campaign::Elected(lead)) => lead,
            Ok(Campaign::Follower) => {
                let held = format!("partition {p} of {} is owned by a worker", J::NAME);
                return Err(TestError::Step(held));
            }
            Err(e) => return Err(TestError::Step(format!("partition {p}: {e}"))),
        };
        let store = self.client().store();
        store
            .claim_partition(J::NAME, p, lead.token(), "run_step")
            .await
            .map_err(step_error)?;
        Ok(lead.token())
    }
}

fn step_error(e: crate::fence::FenceError) -> TestError {
    TestError::Step(e.to_string())
}
