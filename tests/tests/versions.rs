//! Step-list versions (issue 18, item 2), against the dev stack's etcd, NATS
//! and PostgreSQL: a job row records its definition's step names; a worker
//! whose definition does not fit the committed steps (reordered, renamed, or
//! shorter) never resumes the job, hands it back for a fitting worker, and
//! dead-letters it as `definition_changed` once the grace has passed; an
//! appended step fits. Every version below is the job type `test.versioned`,
//! except the two `test.booking` versions (issue 30, item 8): the `on_dead`
//! hook of a definition that does not fit is told so, and never decodes the
//! other version's checkpoint as its own step's output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::job::step_list;
use tenure::testing::TestEnv;
use tenure::{Client, Config, DeadJob, JobId, JobStatus, StepCtx, StepError, Worker};
use tenure_tests::{double_commits, on_kit, wait_until};

/// The input (and every step's output) of each version.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct V {
    n: u64,
}

/// One definition of `test.versioned`: steps named as given, each appending
/// `(job, step index, token, "<worker>:<step name>")` to the guarded
/// `step_log`; step `b` sleeps `slow` first (so a shutdown lands between `b`
/// and `c`).
macro_rules! version {
    ($ty:ident, [$($step:ident),+]) => {
        #[derive(Debug, Clone)]
        struct $ty {
            worker: String,
            schema: String,
            slow: Duration,
        }

        #[tenure::job(name = "test.versioned", retries = 2)]
        impl $ty {
            $(
                #[step]
                async fn $step(&self, ctx: &mut StepCtx, v: V) -> Result<V, StepError> {
                    let name = stringify!($step);
                    if name == "b" {
                        tokio::time::sleep(self.slow).await;
                    }
                    log(ctx, &self.schema, &format!("{}:{name}", self.worker)).await?;
                    Ok(v)
                }
            )+
        }
    };
}

version!(V1, [a, b, c]);
version!(Reordered, [b, a, c]);
version!(Renamed, [a, x, c]);
version!(Appended, [a, b, c, d]);

async fn log(ctx: &mut StepCtx, schema: &str, who: &str) -> Result<(), StepError> {
    let sql = format!(
        "INSERT INTO {schema}.step_log (job_id, step, token, worker) VALUES ($1, $2, $3, $4)"
    );
    sqlx::query(&sql)
        .bind(ctx.job_id().as_uuid())
        .bind(i32::try_from(ctx.step().get()).unwrap_or(i32::MAX))
        .bind(ctx.token().get())
        .bind(who)
        .execute(ctx.db().await?)
        .await?;
    Ok(())
}

/// Starts worker `id` running definition `job`.
async fn start<J: tenure::Job>(cfg: &Config, id: &str, job: J) -> Worker {
    Worker::builder(cfg.clone().with_worker_id(id))
        .register(job)
        .start()
        .await
        .expect("worker")
}

/// Enqueues `n` jobs (as `V1`) and runs their steps `a` and `b` on a `V1`
/// worker that shuts down gracefully while `b` runs: every job is left
/// `pending` with two committed steps, recorded as `["a", "b", "c"]`.
async fn two_steps_done_by_v1(cfg: &Config, ns: &str, client: &Client, n: u64) -> Vec<JobId> {
    let mut jobs = Vec::new();
    for i in 0..n {
        let e = client
            .enqueue::<V1>(&format!("job-{i}"), &V { n: i })
            .await
            .unwrap();
        jobs.push(e.job_id);
    }
    let slow = Duration::from_millis(1500);
    let first = start(cfg, "v1-first", v1(ns, "v1-first", slow)).await;
    let all_in_b = wait_until(Duration::from_secs(30), || async {
        let mut ok = true;
        for id in &jobs {
            ok &= client.job(*id).await.unwrap().unwrap().step.get() >= 1;
        }
        ok
    })
    .await;
    assert!(all_in_b, "every job committed step a");
    // Step a's commit and step b's start are not one instant: under load (a
    // full `make test`) one job was still between them when the shutdown
    // came, and was handed back at step 1. Give b a fifth of its time to start.
    tokio::time::sleep(slow / 5).await;
    first.shutdown().await.unwrap();
    for id in &jobs {
        let row = client.job(*id).await.unwrap().unwrap();
        assert_eq!((row.status, row.step.get()), (JobStatus::Pending, 2));
        assert_eq!(
            row.step_names,
            Some(names(&["a", "b", "c"])),
            "recorded at enqueue"
        );
        assert_eq!(
            row.steps_fingerprint.as_deref(),
            Some(step_list::fingerprint(&["a", "b", "c"]).as_str())
        );
    }
    jobs
}

fn v1(ns: &str, worker: &str, slow: Duration) -> V1 {
    V1 {
        worker: worker.into(),
        schema: ns.into(),
        slow,
    }
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

/// The `worker` column of `job`'s step_log rows, in commit order.
async fn logged(client: &Client, ns: &str, job: JobId) -> Vec<String> {
    sqlx::query_scalar(&format!(
        "SELECT worker FROM {ns}.step_log WHERE job_id = $1 ORDER BY at, step"
    ))
    .bind(job.as_uuid())
    .fetch_all(client.store().pool())
    .await
    .unwrap()
}

async fn all_status(client: &Client, jobs: &[JobId], status: JobStatus, within: Duration) -> bool {
    wait_until(within, || async {
        let mut ok = true;
        for id in jobs {
            ok &= matches!(client.job(*id).await, Ok(Some(r)) if r.status == status);
        }
        ok
    })
    .await
}

#[tenure::test]
async fn reordered_or_renamed_committed_steps_are_never_resumed_and_dead_letter_after_the_grace(
    env: TestEnv,
) {
    let (ns, mut cfg, client) = on_kit(&env).await;
    cfg.definition_grace = Duration::from_secs(2);
    let jobs = two_steps_done_by_v1(&cfg, &ns, &client, 2).await;

    let zero = Duration::ZERO;
    let reordered = Reordered {
        worker: "reordered".into(),
        schema: ns.clone(),
        slow: zero,
    };
    let renamed = Renamed {
        worker: "renamed".into(),
        schema: ns.clone(),
        slow: zero,
    };
    let w1 = start(&cfg, "reordered", reordered).await;
    let w2 = start(&cfg, "renamed", renamed).await;
    assert!(
        all_status(&client, &jobs, JobStatus::Dead, Duration::from_secs(30)).await,
        "no fitting worker within the grace: dead-lettered"
    );
    for id in &jobs {
        let row = client.job(*id).await.unwrap().unwrap();
        let reason = row.last_error.unwrap_or_default();
        assert!(reason.starts_with("definition_changed"), "{reason}");
        assert!(reason.contains(r#"["a", "b", "c"]"#), "{reason}");
        assert!(
            reason.contains(r#"["b", "a", "c"]"#) || reason.contains(r#"["a", "x", "c"]"#),
            "{reason}"
        );
        assert_eq!(row.step.get(), 2, "no step ran under the other definitions");
        assert_eq!(
            logged(&client, &ns, *id).await,
            vec!["v1-first:a", "v1-first:b"]
        );
        let dlq = client.queue().dead_letters(100).await.unwrap();
        let entry = dlq
            .iter()
            .find(|d| d.job_id == Some(*id))
            .expect("in the DLQ");
        assert!(
            entry.reason.contains("definition_changed"),
            "{}",
            entry.reason
        );
    }
    w1.shutdown().await.unwrap();
    w2.shutdown().await.unwrap();
}

#[tenure::test]
async fn rolling_deploy_jobs_mid_flight_finish_on_a_fitting_worker_only(env: TestEnv) {
    let (ns, mut cfg, client) = on_kit(&env).await;
    // Hand-backs every 600 ms (grace / 100), none dead-lettered within the test.
    cfg.definition_grace = Duration::from_secs(60);
    let jobs = two_steps_done_by_v1(&cfg, &ns, &client, 4).await;

    // The new version alone first: it hands every job back, marked.
    let reordered = Reordered {
        worker: "reordered".into(),
        schema: ns.clone(),
        slow: Duration::ZERO,
    };
    let new = start(&cfg, "reordered", reordered).await;
    let marked = wait_until(Duration::from_secs(30), || async {
        let mut ok = true;
        for id in &jobs {
            ok &= client
                .job(*id)
                .await
                .unwrap()
                .unwrap()
                .incompatible_since
                .is_some();
        }
        ok
    })
    .await;
    assert!(
        marked,
        "the reordered worker claimed each job and handed it back"
    );

    // Then an old-version worker next to it: each job finishes there.
    let old = start(&cfg, "v1-second", v1(&ns, "v1-second", Duration::ZERO)).await;
    assert!(all_status(&client, &jobs, JobStatus::Done, Duration::from_secs(60)).await);
    for id in &jobs {
        assert_eq!(
            logged(&client, &ns, *id).await,
            vec!["v1-first:a", "v1-first:b", "v1-second:c"]
        );
        let row = client.job(*id).await.unwrap().unwrap();
        assert_eq!(
            row.incompatible_since, None,
            "a fitting claim clears the mark"
        );
        assert_eq!(row.takeovers, 0, "handing back is no lost owner");
    }
    assert_eq!(double_commits(client.store().pool(), &ns).await, 0);
    new.shutdown().await.unwrap();
    old.shutdown().await.unwrap();
}

#[tenure::test]
async fn an_appended_step_fits_and_a_shorter_definition_never_ends_a_longer_job(env: TestEnv) {
    let (ns, mut cfg, client) = on_kit(&env).await;
    cfg.definition_grace = Duration::from_secs(60);
    let resumed = two_steps_done_by_v1(&cfg, &ns, &client, 2).await;
    // Jobs enqueued by the new version: recorded with four steps.
    let mut fresh = Vec::new();
    for i in 0..4 {
        let e = client
            .enqueue::<Appended>(&format!("new-{i}"), &V { n: i })
            .await
            .unwrap();
        fresh.push(e.job_id);
    }
    // A rolling deploy: both versions run. The old one may take the new jobs'
    // deliveries but never ends them after three steps.
    let old = start(&cfg, "v1-old", v1(&ns, "v1-old", Duration::ZERO)).await;
    let appended = Appended {
        worker: "appended".into(),
        schema: ns.clone(),
        slow: Duration::ZERO,
    };
    let new = start(&cfg, "appended", appended).await;
    let all: Vec<JobId> = resumed.iter().chain(&fresh).copied().collect();
    assert!(all_status(&client, &all, JobStatus::Done, Duration::from_secs(60)).await);
    for id in &fresh {
        let log = logged(&client, &ns, *id).await;
        assert_eq!(log.len(), 4, "{log:?}");
        assert_eq!(log[3], "appended:d", "{log:?}");
    }
    for id in &resumed {
        let log = logged(&client, &ns, *id).await;
        // Resumed by either version: the old one ends after c, the new one runs d.
        assert_eq!(&log[..2], ["v1-first:a", "v1-first:b"], "{log:?}");
        assert!(log[2].ends_with(":c"), "{log:?}");
        let row = client.job(*id).await.unwrap().unwrap();
        let expect = if log.len() == 4 {
            names(&["a", "b", "c", "d"])
        } else {
            names(&["a", "b", "c"])
        };
        assert_eq!(
            row.step_names,
            Some(expect),
            "the resuming definition's list"
        );
    }
    assert_eq!(double_commits(client.store().pool(), &ns).await, 0);
    old.shutdown().await.unwrap();
    new.shutdown().await.unwrap();
}

#[tenure::test]
async fn typed_enqueues_record_the_list_and_one_by_name_records_the_first_claimers(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let abc = Some(names(&["a", "b", "c"]));
    let batch = client
        .enqueue_many::<V1>(&[("batch-1", V { n: 1 }), ("batch-2", V { n: 2 })])
        .await
        .unwrap();
    let mut tx = client.store().pool().begin().await.unwrap();
    let in_tx = client
        .enqueue_in::<V1>(&mut tx, "in-tx", &V { n: 3 })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let typed = batch.into_iter().map(|r| r.unwrap().job_id);
    for id in typed.chain([in_tx.job_id]) {
        assert_eq!(client.job(id).await.unwrap().unwrap().step_names, abc);
    }
    let e = client
        .enqueue_json("test.versioned", "by-name", serde_json::json!({"n": 1}))
        .await
        .unwrap();
    assert_eq!(
        client.job(e.job_id).await.unwrap().unwrap().step_names,
        None
    );
    let w = start(&cfg, "v1", v1(&ns, "v1", Duration::ZERO)).await;
    assert!(
        all_status(
            &client,
            &[e.job_id],
            JobStatus::Done,
            Duration::from_secs(30)
        )
        .await
    );
    let row = client.job(e.job_id).await.unwrap().unwrap();
    assert_eq!(row.step_names, Some(names(&["a", "b", "c"])));
    w.shutdown().await.unwrap();
}

/// A booking's input.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Booking {
    seat: String,
    cents: i64,
}

/// Version A's first output: a reservation fee. Version B's [`Held`] has the
/// same JSON shape on purpose, so A's checkpoint decodes as B's type and only
/// the step names tell them apart.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Reserved {
    seat: String,
    cents: i64,
}

/// Version B's first output: an amount held on a card.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Held {
    seat: String,
    cents: i64,
}

/// Version A of `test.booking`: `reserve`, then `charge`, which fails (the
/// payment service is down) until the test stops A's worker, so the job waits
/// with one committed step.
struct BookingA;

#[tenure::job(name = "test.booking", retries = 1000, on_dead = release_seat)]
impl BookingA {
    #[step]
    async fn reserve(&self, _ctx: &mut StepCtx, b: Booking) -> Result<Reserved, StepError> {
        Ok(Reserved {
            seat: b.seat,
            cents: b.cents,
        })
    }

    #[step]
    async fn charge(&self, _ctx: &mut StepCtx, r: Reserved) -> Result<Reserved, StepError> {
        let _ = r;
        Err(StepError::retry_after(Duration::from_millis(300)))
    }

    async fn release_seat(&self, _ctx: &mut StepCtx, _dead: DeadJob) -> Result<(), StepError> {
        Ok(())
    }
}

/// What version B's hook was told.
#[derive(Debug, Clone)]
struct Told {
    reason: String,
    step: u32,
    step_names: Option<Vec<String>>,
    fits: bool,
    written_by: Option<String>,
    raw: Option<serde_json::Value>,
    decoded: Result<Option<Held>, String>,
}

/// Version B of `test.booking`: `hold`, then `pay`; its hook records what it
/// was told and what `checkpoint_as::<Held>` returned.
struct BookingB {
    told: Arc<Mutex<Option<Told>>>,
}

#[tenure::job(name = "test.booking", on_dead = release_hold)]
impl BookingB {
    #[step]
    async fn hold(&self, _ctx: &mut StepCtx, b: Booking) -> Result<Held, StepError> {
        Ok(Held {
            seat: b.seat,
            cents: b.cents,
        })
    }

    #[step]
    async fn pay(&self, _ctx: &mut StepCtx, h: Held) -> Result<Held, StepError> {
        Ok(h)
    }

    async fn release_hold(&self, _ctx: &mut StepCtx, dead: DeadJob) -> Result<(), StepError> {
        let told = Told {
            reason: dead.reason.clone(),
            step: dead.step.get(),
            step_names: dead.step_names.clone(),
            fits: dead.fits,
            written_by: dead.checkpoint_step_name().map(str::to_string),
            raw: dead.checkpoint.clone(),
            decoded: dead
                .checkpoint_as::<Held>()
                .map_err(|e| e.message().to_string()),
        };
        *self.told.lock().unwrap() = Some(told);
        Ok(())
    }
}

#[tenure::test]
async fn on_dead_of_a_definition_that_does_not_fit_is_told_and_never_decodes_the_other_versions_checkpoint(
    env: TestEnv,
) {
    let (_ns, mut cfg, client) = on_kit(&env).await;
    cfg.definition_grace = Duration::from_secs(1);
    let booking = Booking {
        seat: "12A".into(),
        cents: 500,
    };
    let id = client
        .enqueue::<BookingA>("book-12A", &booking)
        .await
        .unwrap()
        .job_id;

    // Version A commits `reserve`; its `charge` keeps failing.
    let a = start(&cfg, "a", BookingA).await;
    let reserved = wait_until(Duration::from_secs(30), || async {
        let row = client.job(id).await.unwrap().unwrap();
        row.step.get() == 1 && row.attempts >= 1
    })
    .await;
    assert!(reserved, "A committed reserve and charge failed");
    a.shutdown().await.unwrap();
    let row = client.job(id).await.unwrap().unwrap();
    assert_eq!(row.step.get(), 1);
    assert_eq!(row.step_names, Some(names(&["reserve", "charge"])));

    // Version B alone: no fitting worker within the grace, so it dead-letters
    // the job as definition_changed and runs its own hook.
    let told = Arc::new(Mutex::new(None));
    let b = start(&cfg, "b", BookingB { told: told.clone() }).await;
    assert!(all_status(&client, &[id], JobStatus::Dead, Duration::from_secs(30)).await);
    let hook_ran = wait_until(Duration::from_secs(30), || async {
        told.lock().unwrap().is_some()
    })
    .await;
    assert!(hook_ran, "B's on_dead hook ran");
    let told = told.lock().unwrap().clone().unwrap();
    assert!(
        told.reason.starts_with("definition_changed"),
        "{}",
        told.reason
    );
    assert_eq!(told.step, 1);
    assert_eq!(told.step_names, Some(names(&["reserve", "charge"])));
    assert!(!told.fits, "A's committed steps do not fit B");
    assert_eq!(told.written_by.as_deref(), Some("reserve"));
    assert_eq!(
        told.raw,
        Some(serde_json::json!({"seat": "12A", "cents": 500})),
        "the raw checkpoint stays readable"
    );
    let refused = told
        .decoded
        .expect_err("A's reserve output is not decoded as B's hold output");
    assert!(
        refused.contains("reserve") && refused.contains("hold"),
        "{refused}"
    );
    b.shutdown().await.unwrap();
}
