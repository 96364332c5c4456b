//! Redis 7 in the dev stack (`DevStackOptions::redis`): one `redis-server` on a
//! loopback port, no persistence (`--save ""`, no AOF), so a restart forgets
//! every key, as a crashed single Redis does. It is only the torture test's
//! negative control (a TTL lock without a token at the resource); Tenure itself
//! never talks to Redis.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::process::Spec;
use super::ready::{Probe, free_ports, poll_ready};
use super::{DevStack, DevStackError, ServerProcess};

/// The Redis server of a stack and its port.
#[derive(Debug)]
pub(super) struct RedisServer {
    pub(super) process: ServerProcess,
    pub(super) port: u16,
}

impl DevStack {
    pub(super) fn start_redis(&mut self) -> Result<(), DevStackError> {
        let dir = self.dir().join("redis");
        std::fs::create_dir_all(&dir).map_err(|e| DevStackError::io("create redis dir", e))?;
        let port = free_ports(1)?[0];
        let spec = redis_spec(&dir, port);
        self.redis = Some(RedisServer {
            process: ServerProcess::start(spec)?,
            port,
        });
        Ok(())
    }

    /// Waits until Redis answers `PING` with `PONG`; with `starting`, fails at
    /// once if the server exits.
    pub(super) async fn wait_redis(
        &self,
        timeout: Duration,
        starting: bool,
    ) -> Result<(), DevStackError> {
        let Some(redis) = &self.redis else {
            return Ok(());
        };
        let addr = format!("127.0.0.1:{}", redis.port);
        let probe = Probe {
            server: "redis",
            log: redis.process.log_path().to_path_buf(),
            attempt_timeout: Duration::from_secs(2),
            timeout,
            must_run: if starting {
                vec![&redis.process]
            } else {
                Vec::new()
            },
        };
        poll_ready(probe, || ping(&addr)).await
    }

    /// The Redis URL (`redis://127.0.0.1:PORT`).
    ///
    /// # Panics
    /// If Redis was not started (a test bug).
    #[allow(clippy::panic)]
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.redis().port)
    }

    /// The Redis server, for fault injection (`kill`, `restart`: every key is
    /// gone afterwards; `pause`, `resume`).
    ///
    /// # Panics
    /// If Redis was not started (a test bug).
    #[allow(clippy::panic)]
    pub fn redis_server(&self) -> &ServerProcess {
        &self.redis().process
    }

    #[allow(clippy::panic)]
    fn redis(&self) -> &RedisServer {
        self.redis
            .as_ref()
            .unwrap_or_else(|| panic!("Redis was not started in this dev stack"))
    }
}

fn redis_spec(dir: &Path, port: u16) -> Spec {
    let args = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        &dir.display().to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
        "--loglevel",
        "warning",
    ]
    .map(String::from)
    .to_vec();
    Spec {
        name: "redis".into(),
        program: "redis-server".into(),
        args,
        run_as: None,
        log: dir.join("redis.log"),
    }
}

/// One `PING` in RESP over a fresh connection.
async fn ping(addr: &str) -> Result<(), String> {
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    conn.write_all(b"*1\r\n$4\r\nPING\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    let n = conn.read(&mut buf).await.map_err(|e| e.to_string())?;
    let reply = String::from_utf8_lossy(&buf[..n]);
    if reply.starts_with("+PONG") {
        Ok(())
    } else {
        Err(format!("PING answered {reply:?}"))
    }
}
