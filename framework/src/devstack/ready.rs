//! Waiting for a server to answer, and the ports the servers listen on.

use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use super::{DevStackError, ServerProcess};

/// How many lines of a server's log an error carries.
const LOG_TAIL_LINES: usize = 20;

/// One server's readiness probe: what to call it, where its log is, how long
/// one attempt and the whole wait may take, and which processes must stay
/// alive meanwhile (empty after a fault a test injected on purpose).
pub(super) struct Probe<'a> {
    pub server: &'static str,
    pub log: PathBuf,
    pub attempt_timeout: Duration,
    pub timeout: Duration,
    pub must_run: Vec<&'a ServerProcess>,
}

/// Runs `attempt` every 100 ms until it succeeds. Fails at once if a process of
/// `must_run` has exited (its log's tail says why, e.g. a port taken between
/// choosing it and the server binding it), and after `timeout` otherwise.
pub(super) async fn poll_ready<F, Fut>(
    probe: Probe<'_>,
    mut attempt: F,
) -> Result<(), DevStackError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + probe.timeout;
    loop {
        let last_error = match tokio::time::timeout(probe.attempt_timeout, attempt()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {:?}", probe.attempt_timeout),
        };
        if let Some(dead) = probe.must_run.iter().find(|p| !p.is_running()) {
            return Err(DevStackError::Exited {
                server: dead.name().to_string(),
                log_tail: log_tail(dead.log_path()),
            });
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(DevStackError::NotReady {
                server: probe.server.into(),
                timeout: probe.timeout,
                last_error,
                log: probe.log.display().to_string(),
                log_tail: log_tail(&probe.log),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The last lines of a log file (empty if it cannot be read).
pub(super) fn log_tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// Free loopback ports for servers, all distinct.
///
/// Chosen below the kernel's ephemeral range (`ip_local_port_range`) when there
/// is room: a port the kernel handed out for `127.0.0.1:0` and we released can
/// be taken again by the next outgoing connection of any process before the
/// server binds it, and then the server cannot start. Outside that range only
/// another process choosing ports the same way can collide, which
/// [`DevStackError::is_port_clash`] lets the stack retry.
pub(super) fn free_ports(n: usize) -> Result<Vec<u16>, DevStackError> {
    // Ports this process already gave out, so two stacks of one process never
    // pick the same one even while the first server has not bound it yet.
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let (low, high) = quiet_range();
    let span = u32::from(high - low);
    let mut listeners = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    for _ in 0..span.min(20 * n as u32 + 200) {
        if ports.len() == n {
            break;
        }
        let port = low + (rand::random::<u32>() % span) as u16;
        if given.contains(&port) || ports.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            listeners.push(listener);
            ports.push(port);
        }
    }
    while ports.len() < n {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| DevStackError::io("bind a free loopback port", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| DevStackError::io("read a bound port", e))?
            .port();
        listeners.push(listener);
        ports.push(port);
    }
    given.extend(&ports);
    Ok(ports)
}

/// The ports below the ephemeral range, `[10000, ephemeral low)`, or the whole
/// unprivileged range if the ephemeral range leaves too little room below it.
fn quiet_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if ephemeral_low >= 12000 {
        (10000, ephemeral_low)
    } else {
        (1024, u16::MAX)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_outside_the_ephemeral_range() {
        let (low, high) = quiet_range();
        let a = free_ports(8).unwrap();
        let b = free_ports(8).unwrap();
        let mut all: Vec<u16> = a.iter().chain(&b).copied().collect();
        assert!(all.iter().all(|p| (low..high).contains(p)), "{all:?}");
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 16, "a port was given twice");
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let text: Vec<String> = (0..50).map(|i| format!("line {i}")).collect();
        std::fs::write(&path, text.join("\n")).unwrap();
        let tail = log_tail(&path);
        assert!(
            tail.starts_with("line 30\n") && tail.ends_with("line 49"),
            "{tail}"
        );
        assert_eq!(log_tail(&dir.path().join("missing")), "");
    }
}
