//! CPU time per process, read from `/proc` (the pipeline benchmark's way):
//! each server is its own process group, PostgreSQL's backends are the
//! postmaster's children (those that ended in its `cutime`/`cstime`), the
//! worker and the producers are this process.

use anyhow::{Context, Result};

/// The servers' pids (`BISECT_PIDS='etcd=1,2,3;nats=4;postgres=5'`).
pub struct Pids {
    etcd: Vec<u32>,
    nats: u32,
    pg: u32,
}

impl Pids {
    pub fn from_env() -> Result<Pids> {
        let raw = std::env::var("BISECT_PIDS").context("BISECT_PIDS is not set")?;
        let list = |name: &str| -> Vec<u32> {
            raw.split(';')
                .filter_map(|kv| kv.split_once('='))
                .filter(|(k, _)| *k == name)
                .flat_map(|(_, v)| v.split(',').filter_map(|p| p.parse().ok()))
                .collect()
        };
        let one = |name: &str| {
            list(name)
                .first()
                .copied()
                .context(format!("no {name} pid"))
        };
        Ok(Pids {
            etcd: list("etcd"),
            nats: one("nats")?,
            pg: one("postgres")?,
        })
    }
}

/// CPU ms by process.
#[derive(Clone, Copy, Default)]
pub struct Cpu {
    etcd: f64,
    nats: f64,
    pg: f64,
    worker: f64,
}

impl Cpu {
    pub fn now(pids: &Pids) -> Cpu {
        let me = std::process::id();
        let mut cpu = Cpu::default();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return cpu;
        };
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some((ppid, pgrp, ms)) = stat(pid) {
                if pids.etcd.contains(&pgrp) {
                    cpu.etcd += ms;
                } else if pgrp == pids.nats {
                    cpu.nats += ms;
                } else if pgrp == pids.pg || ppid == pids.pg {
                    cpu.pg += ms;
                } else if pid == me {
                    cpu.worker += ms;
                }
            }
        }
        cpu
    }

    pub fn per_job_since(self, before: Cpu, jobs: usize) -> Cpu {
        let n = jobs as f64;
        Cpu {
            etcd: (self.etcd - before.etcd) / n,
            nats: (self.nats - before.nats) / n,
            pg: (self.pg - before.pg) / n,
            worker: (self.worker - before.worker) / n,
        }
    }

    pub fn line(&self) -> String {
        format!(
            "cpu_ms_per_job(etcd={:.3} nats={:.3} pg={:.3} worker={:.3} total={:.3})",
            self.etcd,
            self.nats,
            self.pg,
            self.worker,
            self.etcd + self.nats + self.pg + self.worker
        )
    }
}

/// `(ppid, pgrp, cpu ms)` of `pid`; a postmaster's reaped children count
/// (any process's `cutime`/`cstime` do: only the postmaster's are large).
fn stat(pid: u32) -> Option<(u32, u32, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    let ppid = f.get(1)?.parse().ok()?;
    let pgrp = f.get(2)?.parse().ok()?;
    let ticks = num(11)? + num(12)? + num(13).unwrap_or(0.0) + num(14).unwrap_or(0.0);
    Some((ppid, pgrp, ticks * 10.0))
}
