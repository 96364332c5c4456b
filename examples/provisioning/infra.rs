//! The infrastructure side: a small resource service (networks, volumes, VMs, DNS
//! records) that answers NATS requests and enforces fences on its own writes, and
//! the provisioning job whose steps call it.
//!
//! Each request carries the step's fence (`Tenure-Fence-Job-Id`, `Tenure-Fence`)
//! and an idempotency key (`Idempotency-Key`). The service keeps its resources in
//! PostgreSQL and the largest token it has accepted per job in a [`TokenGate`]
//! over [`PgFenceMarks`]: each request's admission and its write are one
//! transaction, so no newer owner is admitted between the check and the create,
//! and a mark is kept after the job finished, so a paused owner that wakes up
//! later is still refused. It creates at most one resource per idempotency key:
//! a retry of the same call, by the same owner or by the next one, gets the
//! resource created the first time.
//!
//! A caller calls on a subject of its own, `<subject>.<caller>`: where each
//! caller has a NATS user allowed to publish there only (the demo's secured
//! dev stack, `callers.rs`), the subject names the caller and the server
//! vouches for it; the gate orders callers, it does not authenticate them.

use std::sync::Arc;

use async_nats::HeaderMap;
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tenure::blocks::queue::headers::{fence_headers, read_fence};
use tenure::{GateError, PgFenceMarks, StaleToken, TokenGate};
use tenure::{JobId, ObservedFence, StepCtx, StepError};

/// The job's step names, in order (for the narration).
pub const STEP_NAMES: [&str; 4] = [
    "allocate_network",
    "create_volume",
    "boot_vm",
    "register_dns",
];

/// The idempotency key of a create request.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// A create request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateReq {
    /// `network`, `volume`, `vm` or `dns`.
    pub kind: String,
    /// The resource's name.
    pub name: String,
}

/// The service's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Reply {
    /// A new resource.
    Created { id: String },
    /// The resource created earlier under the same idempotency key.
    Existing { id: String },
    /// The write was refused: a stale token, or no fence at all.
    Refused {
        reason: String,
        /// Set when the token was stale: (ours, current).
        stale: Option<(i64, i64)>,
    },
    /// The service's database failed; nothing was written (retry).
    Unavailable { reason: String },
}

/// One request as the service saw it (for the narration and the checks).
#[derive(Debug, Clone)]
pub struct Seen {
    /// The caller, as the request's subject names it (`<subject>.<caller>`).
    pub caller: String,
    pub token: Option<ObservedFence>,
    pub kind: String,
    pub key: String,
    pub reply: Reply,
}

/// The service's state: resources and fence marks in PostgreSQL.
struct State {
    pool: PgPool,
    gate: TokenGate<PgFenceMarks>,
    /// `"<schema>".infra_resources`: idempotency key -> resource.
    resources: String,
}

/// The resource service, answering on `subject` until dropped.
pub struct InfraService {
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for InfraService {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl InfraService {
    /// Creates its tables in `schema` (fence marks and resources; the job rows
    /// it verifies tokens against live there too), subscribes to every
    /// caller's subject `<subject>.*` and serves every request; `on_request`
    /// hears about each one after it was answered.
    pub async fn start(
        nats: async_nats::Client,
        subject: String,
        pool: PgPool,
        schema: &str,
        on_request: impl Fn(&Seen) + Send + Sync + 'static,
    ) -> anyhow::Result<Self> {
        // Verifying marks: a token above the job row's fence was never issued
        // (a forged `Tenure-Fence` cannot raise the mark past the real owner).
        let marks = PgFenceMarks::verified(schema, schema)?;
        let resources = format!("\"{schema}\".infra_resources");
        let mut conn = pool.acquire().await?;
        marks.install(&mut conn).await?;
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {resources} \
             (idem_key text PRIMARY KEY, kind text NOT NULL, id text NOT NULL)"
        ))
        .execute(&mut *conn)
        .await?;
        drop(conn);
        let state = Arc::new(State {
            pool,
            gate: TokenGate::new(marks),
            resources,
        });
        let mut sub = nats.subscribe(format!("{subject}.*")).await?;
        nats.flush().await?;
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let caller = msg.subject.rsplit('.').next().unwrap_or_default();
                let mut seen = st.handle(msg.headers.as_ref(), &msg.payload).await;
                seen.caller = caller.to_string();
                if let Some(reply) = msg.reply {
                    let body = serde_json::to_vec(&seen.reply).unwrap_or_default();
                    if let Err(e) = nats.publish(reply, body.into()).await {
                        tracing::warn!(error = %e, "infra service: reply failed");
                    }
                }
                on_request(&seen);
            }
        });
        Ok(InfraService { state, task })
    }

    /// Resources created so far, of `kind`.
    pub async fn created(&self, kind: &str) -> anyhow::Result<i64> {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE kind = $1",
            self.state.resources
        );
        Ok(sqlx::query_scalar(&sql)
            .bind(kind)
            .fetch_one(&self.state.pool)
            .await?)
    }

    /// The largest token the service accepted for `job` (its mark).
    pub async fn fence_of(&self, job: JobId) -> anyhow::Result<Option<ObservedFence>> {
        let mut conn = self.state.pool.acquire().await?;
        Ok(self.state.gate.marks().current(&mut conn, job).await?)
    }
}

impl State {
    async fn handle(&self, headers: Option<&HeaderMap>, payload: &[u8]) -> Seen {
        let fence = headers.and_then(read_fence);
        let key = headers
            .and_then(|h| h.get(IDEMPOTENCY_KEY))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        let req: Option<CreateReq> = serde_json::from_slice(payload).ok();
        let kind = req.as_ref().map(|r| r.kind.clone()).unwrap_or_default();
        let refused = |reason: &str| Reply::Refused {
            reason: reason.into(),
            stale: None,
        };
        let reply = match (fence, req) {
            (None, _) => refused("no fence: a write needs Tenure-Fence-Job-Id and Tenure-Fence"),
            (_, None) => refused("malformed request"),
            (Some(_), Some(_)) if key.is_empty() => refused("no Idempotency-Key"),
            (Some((job, token)), Some(req)) => {
                match self.fenced_create(job, token, &key, &req).await {
                    Ok(reply) => reply,
                    Err(GateError::Stale(stale)) => Reply::Refused {
                        reason: stale.to_string(),
                        stale: Some((stale.ours.get(), stale.current.get())),
                    },
                    Err(e @ GateError::Unverified { .. }) => refused(&e.to_string()),
                    Err(e) => Reply::Unavailable {
                        reason: e.to_string(),
                    },
                }
            }
        };
        Seen {
            caller: String::new(),
            token: fence.map(|(_, t)| t),
            kind,
            key,
            reply,
        }
    }

    /// Admission and the create in one transaction: a stale token rolls back
    /// before anything is written, and no newer token is admitted in between.
    async fn fenced_create(
        &self,
        job: JobId,
        token: ObservedFence,
        key: &str,
        req: &CreateReq,
    ) -> Result<Reply, GateError> {
        let mut tx = self.pool.begin().await?;
        self.gate.admit(&mut tx, job, token).await?;
        let reply = self.create(&mut tx, key, req).await?;
        tx.commit().await?;
        Ok(reply)
    }

    /// At most one resource per idempotency key.
    async fn create(
        &self,
        tx: &mut PgConnection,
        key: &str,
        req: &CreateReq,
    ) -> Result<Reply, sqlx::Error> {
        let t = &self.resources;
        let existing: Option<String> =
            sqlx::query_scalar(&format!("SELECT id FROM {t} WHERE idem_key = $1"))
                .bind(key)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some(id) = existing {
            return Ok(Reply::Existing { id });
        }
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) + 1 FROM {t} WHERE kind = $1"))
            .bind(&req.kind)
            .fetch_one(&mut *tx)
            .await?;
        let id = format!("{}-{}-{n}", req.kind, req.name);
        sqlx::query(&format!(
            "INSERT INTO {t} (idem_key, kind, id) VALUES ($1, $2, $3)"
        ))
        .bind(key)
        .bind(&req.kind)
        .bind(&id)
        .execute(&mut *tx)
        .await?;
        Ok(Reply::Created { id })
    }
}

/// How a step (or anyone) calls the service: as `caller`, on
/// `<subject>.<caller>`.
#[derive(Debug, Clone)]
pub struct InfraClient {
    nats: async_nats::Client,
    subject: String,
}

impl InfraClient {
    /// A client calling the service at `subject` as `caller` (on a secured
    /// server, `nats` is `caller`'s own user, which may publish there only).
    pub fn new(nats: async_nats::Client, subject: &str, caller: &str) -> Self {
        InfraClient {
            nats,
            subject: format!("{subject}.{caller}"),
        }
    }

    /// Sends a create request carrying `fence` and `key`; returns the raw reply.
    pub async fn send(
        &self,
        fence: Option<(JobId, ObservedFence)>,
        key: &str,
        req: &CreateReq,
    ) -> anyhow::Result<Reply> {
        let mut headers = match fence {
            Some((job, token)) => fence_headers(job, token),
            None => HeaderMap::new(),
        };
        headers.insert(IDEMPOTENCY_KEY, key);
        let body = serde_json::to_vec(req)?;
        let msg = self
            .nats
            .request_with_headers(self.subject.clone(), headers, body.into())
            .await?;
        Ok(serde_json::from_slice(&msg.payload)?)
    }

    /// A step's create: the step's fence and a stable idempotency key (labelled
    /// by the kind) go along; a stale verdict becomes the fence's own error, so
    /// the runtime treats it like a write PostgreSQL refused.
    async fn create(&self, ctx: &StepCtx, kind: &str, name: &str) -> Result<String, StepError> {
        let key = ctx.idempotency_key(kind);
        let req = CreateReq {
            kind: kind.into(),
            name: name.into(),
        };
        let fence = Some((ctx.job_id(), ctx.token().observed()));
        let reply = ctx
            .guard(async {
                self.send(fence, &key, &req)
                    .await
                    .map_err(|e| StepError::retryable(format!("infra service: {e:#}")))
            })
            .await?;
        match reply {
            Reply::Created { id } | Reply::Existing { id } => Ok(id),
            Reply::Refused {
                stale: Some((ours, current)),
                ..
            } => {
                let (Some(ours), Some(current)) =
                    (ObservedFence::new(ours), ObservedFence::new(current))
                else {
                    return Err(StepError::permanent("infra service: malformed stale reply"));
                };
                Err(StaleToken::new(ours, current)
                    .fenced_out(ctx.job_id())
                    .into())
            }
            Reply::Refused { reason, .. } => Err(StepError::permanent(format!(
                "infra service refused: {reason}"
            ))),
            Reply::Unavailable { reason } => Err(StepError::retryable(format!(
                "infra service unavailable: {reason}"
            ))),
        }
    }
}

/// The job's input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProvisionReq {
    /// The machine's name.
    pub name: String,
}

/// Output of `allocate_network`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Network {
    pub name: String,
    pub network: String,
}

/// Output of `create_volume`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Volume {
    pub net: Network,
    pub volume: String,
}

/// Output of `boot_vm`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Vm {
    pub vol: Volume,
    pub vm: String,
}

/// Output of `register_dns` (the job's output).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Provisioned {
    pub vm: String,
    pub dns: String,
}

/// The provisioning job.
#[derive(Debug, Clone)]
pub struct Provision {
    infra: InfraClient,
    /// Worker A's fate: it stops right after the VM booted, before the step's
    /// checkpoint commits, and the demo kills it there (power loss, OOM kill).
    crash_after_boot: bool,
}

impl Provision {
    pub fn new(infra: InfraClient, crash_after_boot: bool) -> Self {
        Provision {
            infra,
            crash_after_boot,
        }
    }
}

#[tenure::job(name = "infra.provision", max_takeovers = 3, retries = 3)]
impl Provision {
    /// Allocates a private network.
    #[step]
    async fn allocate_network(
        &self,
        ctx: &mut StepCtx,
        req: ProvisionReq,
    ) -> Result<Network, StepError> {
        let network = self.infra.create(ctx, "network", &req.name).await?;
        Ok(Network {
            name: req.name,
            network,
        })
    }

    /// Creates the boot volume.
    #[step]
    async fn create_volume(&self, ctx: &mut StepCtx, net: Network) -> Result<Volume, StepError> {
        let volume = self.infra.create(ctx, "volume", &net.name).await?;
        Ok(Volume { net, volume })
    }

    /// Boots the VM: the expensive side effect that must not happen twice.
    #[step]
    async fn boot_vm(&self, ctx: &mut StepCtx, vol: Volume) -> Result<Vm, StepError> {
        let vm = self.infra.create(ctx, "vm", &vol.net.name).await?;
        if self.crash_after_boot {
            // Tell the demo, then wait for its SIGKILL: the VM exists, the step's
            // checkpoint does not.
            println!("BOOTED {} {} {}", ctx.job_id(), ctx.step(), ctx.token());
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            std::future::pending::<()>().await;
        }
        Ok(Vm { vol, vm })
    }

    /// Publishes the VM's name.
    #[step]
    async fn register_dns(&self, ctx: &mut StepCtx, vm: Vm) -> Result<Provisioned, StepError> {
        let dns = self.infra.create(ctx, "dns", &vm.vol.net.name).await?;
        Ok(Provisioned { vm: vm.vm, dns })
    }
}
