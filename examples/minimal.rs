// Cargo.toml: tenure = { version = "0.1", features = ["devstack"] }, sqlx = "0.8",
//             tokio = { version = "1", features = ["full"] }
use std::time::Duration;
use tenure::{Client, Config, StepCtx, StepError, Worker, devstack::DevStack};

struct Checkout;

#[tenure::job(name = "shop.checkout", retries = 3)]
impl Checkout {
    #[step] // an external call: send a key that is the same for every owner and retry
    async fn charge(&self, ctx: &mut StepCtx, cents: i64) -> Result<String, StepError> {
        let key = ctx.idempotency_key("charge");
        Ok(format!("charged {cents} cents as {key}"))
    }

    #[step] // ctx.db(): a transaction that commits with the step, under the fence
    async fn record(&self, ctx: &mut StepCtx, charge: String) -> Result<String, StepError> {
        let note = sqlx::query_scalar("SELECT $1 || ', recorded'").bind(charge);
        Ok(note.fetch_one(ctx.db().await?).await?)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Your servers if TENURE_* name them, else etcd x3, NATS and PostgreSQL as child processes.
    let (cfg, _stack) = if Config::env_has_servers() {
        (Config::from_env()?, None)
    } else {
        let s = DevStack::start().await?;
        let cfg = Config::new("minimal").with_etcd_endpoints(s.etcd_endpoints());
        let cfg = cfg
            .with_nats_url(s.nats_url())
            .with_database_url(s.database_url());
        (cfg, Some(s))
    };
    let client = Client::connect(&cfg).await?;
    client.migrate().await?; // once per schema, idempotent
    let worker = Worker::builder(cfg).register(Checkout).start().await?;
    let job = client.enqueue::<Checkout>("order-1", &1_250).await?; // same key, same job
    let out = client.wait::<Checkout>(job.job_id, Duration::from_secs(60));
    println!("job {} done: {}", job.job_id, out.await?);
    worker.shutdown().await?;
    Ok(())
}
