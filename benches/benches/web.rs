//! Page load times of `tenure serve` over a million job rows.
//!
//! ```sh
//! cargo build --release -p tenure-cli                 # the `tenure` binary the bench starts
//! cargo bench -p tenure-benches --bench web           # TENURE_BENCH_WEB_ROWS=1000000, _REQUESTS=20
//! ```
//!
//! Starts its own dev stack, fills `TENURE_BENCH_WEB_ROWS` job rows in one
//! `INSERT .. SELECT generate_series` (`FenceStore::insert_synthetic_jobs`),
//! starts `tenure serve` (`TENURE_BIN`, default `<target>/release/tenure`) on a
//! free loopback port, and times `TENURE_BENCH_WEB_REQUESTS` sequential GETs of
//! each page (whole response read over a fresh HTTP/1.1 connection). Prints
//! one line per page and writes `target/tenure-bench/web.json`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use tenure::blocks::queue::Queue;
use tenure::devstack::DevStack;
use tenure::{Client, Config};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `tenure` binary: `TENURE_BIN`, or `release/tenure` beside this bench's directory.
fn tenure_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TENURE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let release = exe
        .parent()
        .and_then(|deps| deps.parent())
        .ok_or_else(|| anyhow!("no target directory above {}", exe.display()))?;
    let bin = release.join("tenure");
    if !bin.exists() {
        return Err(anyhow!(
            "{} is missing: run `cargo build --release -p tenure-cli` first (or set TENURE_BIN)",
            bin.display()
        ));
    }
    Ok(bin)
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_serve(cfg: &Config) -> Result<(Serve, String)> {
    let mut child = Command::new(tenure_bin()?)
        .args(["--nats", &cfg.nats_url, "--database-url", &cfg.database_url])
        .args(["--namespace", &cfg.namespace, "--schema", &cfg.schema])
        .args(["serve", "--bind", "127.0.0.1:0"])
        .env_remove("TENURE_OPERATOR_TOKEN")
        .env_remove("TENURE_OPERATOR_TOKEN_FILE")
        .env_remove("TENURE_READ_TOKEN")
        .env_remove("TENURE_READ_TOKEN_FILE")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting tenure serve")?;
    let out = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let serve = Serve(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    let addr = line
        .strip_prefix("listening on http://")
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| anyhow!("unexpected first line from tenure serve: {line:?}"))?
        .to_string();
    Ok((serve, addr))
}

/// One GET over a fresh connection: (status line, body length, elapsed).
fn get(addr: &str, path: &str) -> Result<(String, usize, Duration)> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let elapsed = t.elapsed();
    let text = String::from_utf8_lossy(&buf);
    let status = text.lines().next().unwrap_or_default().to_string();
    Ok((status, buf.len(), elapsed))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

fn time_page(addr: &str, path: &str, n: u64) -> Result<serde_json::Value> {
    let mut ms = Vec::new();
    let mut bytes = 0;
    for _ in 0..n {
        let (status, len, d) = get(addr, path)?;
        if !status.contains(" 200 ") {
            return Err(anyhow!("GET {path}: {status}"));
        }
        bytes = len;
        ms.push(d.as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    let (p50, p95, max) = (
        percentile(&ms, 0.5),
        percentile(&ms, 0.95),
        percentile(&ms, 1.0),
    );
    println!("web.page path={path} p50_ms={p50:.1} p95_ms={p95:.1} max_ms={max:.1} bytes={bytes}");
    Ok(
        serde_json::json!({ "path": path, "p50_ms": p50, "p95_ms": p95, "max_ms": max, "bytes": bytes }),
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let rows = env_num("TENURE_BENCH_WEB_ROWS", 1_000_000) as i64;
    let requests = env_num("TENURE_BENCH_WEB_REQUESTS", 20);
    let stack = DevStack::start().await?;
    let ns = DevStack::unique_namespace("bench_web");
    let cfg = Config::new(ns.clone())
        .with_schema(ns.clone())
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_nats_url(stack.nats_url())
        .with_database_url(stack.database_url());
    let client = Client::connect(&cfg).await?;
    client.migrate().await?;
    Queue::provision(&cfg).await?;
    let t = Instant::now();
    let inserted = client
        .store()
        .insert_synthetic_jobs("bench.web", rows)
        .await?;
    let fill_s = t.elapsed().as_secs_f64();
    println!("web.fill rows={inserted} seconds={fill_s:.1}");
    let page = client
        .store()
        .list_jobs_page(&Default::default(), None, 1)
        .await?;
    let job = page.first().ok_or_else(|| anyhow!("no rows"))?.id;

    let (_serve, addr) = start_serve(&cfg)?;
    let mut results = Vec::new();
    for path in [
        "/".to_string(),
        "/jobs".into(),
        "/jobs?status=dead".into(),
        "/jobs?type=bench.web&takeovers=on".into(),
        "/jobs?age=1h".into(),
        format!("/jobs/{job}"),
        "/api/overview".into(),
        "/workers".into(),
    ] {
        results.push(time_page(&addr, &path, requests)?);
    }
    let out = serde_json::json!({ "rows": inserted, "fill_seconds": fill_s, "requests": requests, "pages": results });
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("tenure-bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("web.json"), serde_json::to_string_pretty(&out)?)?;
    drop(stack);
    Ok(())
}
