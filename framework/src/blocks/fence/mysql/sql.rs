//! The SQL of the MySQL/MariaDB fence (InnoDB).

/// The fence row per job, and the marker of an open fenced transaction (one
/// row per connection, inserted by the fenced transaction and deleted before
/// its commit, so only that open transaction ever sees it).
pub(super) const MIGRATE_TABLES: &str = "
CREATE TABLE IF NOT EXISTS tenure_fence (
    job_id     CHAR(36)     NOT NULL PRIMARY KEY,
    token      BIGINT       NOT NULL,
    updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS tenure_fence_tx (
    conn_id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    job_id  CHAR(36)        NOT NULL,
    token   BIGINT          NOT NULL
) ENGINE=InnoDB;
";

/// The guard's check, called by the triggers of every guarded table: the
/// current transaction carries a marker whose token is the job's fence.
pub(super) const MIGRATE_GUARD: &str = "
CREATE OR REPLACE PROCEDURE tenure_guard_check(tbl VARCHAR(64))
BEGIN
    DECLARE msg VARCHAR(255) DEFAULT CONCAT(
        'tenure: write to guarded table ', tbl, ' outside a fenced transaction');
    IF NOT EXISTS (
        SELECT 1 FROM tenure_fence_tx m
          JOIN tenure_fence f ON f.job_id = m.job_id AND f.token = m.token
         WHERE m.conn_id = CONNECTION_ID()) THEN
        SIGNAL SQLSTATE 'TF001' SET MESSAGE_TEXT = msg;
    END IF;
END
";

/// Creates the job's fence row at 0 if it has none, and takes its exclusive
/// lock either way: on a duplicate key, `ON DUPLICATE KEY UPDATE` locks the
/// existing row X (an `INSERT IGNORE` would lock it S, and two owners holding
/// S who both ask for X next deadlock). The update changes nothing.
pub(super) const LOCK_ROW: &str = "INSERT INTO tenure_fence (job_id, token) VALUES (?, 0) \
                                   ON DUPLICATE KEY UPDATE token = token";
/// Reads the job's fence under the lock [`LOCK_ROW`] took (a locking read:
/// the newest committed token, whatever the isolation level).
pub(super) const READ_LOCKED: &str = "SELECT token FROM tenure_fence WHERE job_id = ? FOR UPDATE";
/// Raises the fence to our token (a no-op at an equal one), under the lock.
pub(super) const RAISE: &str = "UPDATE tenure_fence SET token = ? WHERE job_id = ? AND token <= ?";
/// Marks this transaction as the job's fenced one for the guard.
pub(super) const MARK: &str = "REPLACE INTO tenure_fence_tx (conn_id, job_id, token) \
                               VALUES (CONNECTION_ID(), ?, ?)";
/// Removes the marker before the commit.
pub(super) const UNMARK: &str = "DELETE FROM tenure_fence_tx WHERE conn_id = CONNECTION_ID()";
/// The job's fence, read without a lock.
pub(super) const READ_FENCE: &str = "SELECT token FROM tenure_fence WHERE job_id = ?";

/// The guard triggers of `table` (one per event: MariaDB has no multi-event
/// trigger). `table` is a checked identifier.
pub(super) fn guard_triggers(table: &str) -> Vec<String> {
    [("i", "INSERT"), ("u", "UPDATE"), ("d", "DELETE")]
        .iter()
        .map(|(suffix, event)| {
            format!(
                "CREATE OR REPLACE TRIGGER `tenure_guard_{table}_{suffix}` BEFORE {event} \
                 ON `{table}` FOR EACH ROW CALL tenure_guard_check('{table}')"
            )
        })
        .collect()
}

/// Drops the guard triggers of `table`.
pub(super) fn drop_guard_triggers(table: &str) -> Vec<String> {
    ["i", "u", "d"]
        .iter()
        .map(|suffix| format!("DROP TRIGGER IF EXISTS `tenure_guard_{table}_{suffix}`"))
        .collect()
}
