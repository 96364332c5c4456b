//! Disaster recovery of the dev stack's etcd cluster, for fault injection: a
//! snapshot, a restore of every member from it (revisions go back to the
//! snapshot's), and a revision bump that moves them past every revision handed
//! out before.
//!
//! Measured on etcd 3.4.23 (Debian): `etcdctl snapshot restore` has no
//! `--bump-revision` (it came with etcd 3.5's `etcdutl`), so the bump is done by
//! writing after the restore, before anyone else may use the cluster: the caller
//! keeps Tenure's workers away (freezes them) until [`DevStack::etcd_bump_revision`]
//! returns.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{DevStack, DevStackError};

impl DevStack {
    /// Saves a snapshot of the etcd keyspace (taken from member 0) to `path` and
    /// returns the revision it holds.
    ///
    /// # Errors
    /// [`DevStackError::CommandFailed`] if `etcdctl` fails.
    pub fn etcd_snapshot(&self, path: &Path) -> Result<i64, DevStackError> {
        let endpoint = self.etcd_endpoints().into_iter().next().unwrap_or_default();
        let target = path.display().to_string();
        etcdctl(&[
            format!("--endpoints={endpoint}"),
            "snapshot".into(),
            "save".into(),
            target.clone(),
        ])?;
        let status = etcdctl(&[
            "snapshot".into(),
            "status".into(),
            target,
            "--write-out=json".into(),
        ])?;
        serde_json::from_str::<serde_json::Value>(&status)
            .ok()
            .and_then(|v| v.get("revision").and_then(serde_json::Value::as_i64))
            .ok_or_else(|| DevStackError::CommandFailed {
                command: "etcdctl snapshot status".into(),
                output: status,
            })
    }

    /// Restores every etcd member from `snapshot`, as an operator recovering
    /// from a disaster would: all members are killed, their data replaced by the
    /// snapshot (same names and peer URLs), and started again. Afterwards the
    /// cluster's revision is the snapshot's: keys and leases created since are
    /// gone, and the next write reuses revisions that were handed out before.
    ///
    /// # Errors
    /// [`DevStackError::CommandFailed`] (`etcdctl snapshot restore`), I/O, or a
    /// cluster that does not come back within `timeout`.
    pub async fn etcd_restore(
        &self,
        snapshot: &Path,
        timeout: Duration,
    ) -> Result<(), DevStackError> {
        for member in &self.etcd {
            member.kill()?;
        }
        let cluster = self.etcd_cluster();
        for (i, member) in self.etcd.iter().enumerate() {
            let serial = self.etcd_serials.get(i).copied().unwrap_or(i);
            let data = self.dir().join(format!("etcd{serial}"));
            if data.exists() {
                std::fs::remove_dir_all(&data)
                    .map_err(|e| DevStackError::io(format!("remove {}", data.display()), e))?;
            }
            let peer = self.etcd_peer_ports.get(i).copied().unwrap_or_default();
            etcdctl(&[
                "snapshot".into(),
                "restore".into(),
                snapshot.display().to_string(),
                format!("--name=m{serial}"),
                format!("--data-dir={}", data.display()),
                format!("--initial-cluster={cluster}"),
                format!("--initial-cluster-token={}", self.etcd_token()),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            ])?;
            member.restart()?;
        }
        self.wait_etcd(timeout, false).await
    }

    /// Writes to etcd until its revision is above `past`: after a restore, what
    /// `--bump-revision` would have done, so that every later lock gets a larger
    /// revision than any handed out before the restore. Several writers at once.
    ///
    /// etcd's refusals (a cluster just restored may still be electing) are
    /// tried again for up to a minute.
    ///
    /// # Errors
    /// [`DevStackError::NotReady`] if etcd refuses or does not answer for a
    /// minute.
    pub async fn etcd_bump_revision(&self, past: i64) -> Result<i64, DevStackError> {
        let endpoints = self.etcd_endpoints();
        let deadline = tokio::time::Instant::now() + BUMP_TIMEOUT;
        let unreachable = |last_error: String| DevStackError::NotReady {
            server: "etcd".into(),
            timeout: BUMP_TIMEOUT,
            last_error,
            log: self.dir().join("etcd0.log").display().to_string(),
            log_tail: String::new(),
        };
        let client = etcd_client::Client::connect(&endpoints, None)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let writers = (0..8).map(|w| {
            let kv = client.kv_client();
            bump_writer(kv, format!("__tenure_devstack_bump_{w}"), past, deadline)
        });
        let reached = futures::future::try_join_all(writers)
            .await
            .map_err(unreachable)?;
        Ok(reached.into_iter().max().unwrap_or(past))
    }
}

/// How long [`DevStack::etcd_bump_revision`] rides out etcd's refusals (a
/// cluster just restored may still be electing its leader).
const BUMP_TIMEOUT: Duration = Duration::from_secs(60);

/// Puts `key` until a put's revision is past `past`; a refused or unanswered
/// put (no quorum yet: "request timed out", "no leader", a member that does
/// not answer within 5 s) is tried again every 200 ms until `deadline`.
async fn bump_writer(
    mut kv: etcd_client::KvClient,
    key: String,
    past: i64,
    deadline: tokio::time::Instant,
) -> Result<i64, String> {
    loop {
        let put = tokio::time::timeout(Duration::from_secs(5), kv.put(key.as_str(), "", None));
        let error = match put.await {
            Ok(Ok(put)) => {
                let revision = put.header().map_or(0, |h| h.revision());
                if revision > past {
                    return Ok(revision);
                }
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 5 s".to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(error);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `etcdctl` (API v3) with `args`; its stdout.
fn etcdctl(args: &[String]) -> Result<String, DevStackError> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(args)
        .output()
        .map_err(|e| DevStackError::io("run etcdctl", e))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(DevStackError::CommandFailed {
        command: format!("etcdctl {}", args.join(" ")),
        output: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
