//! The client's side of the namespace's recorded way of owning jobs
//! ([`Config::partitions`](crate::Config::partitions)): a job published under
//! another way than the workers' lands on a subject no consumer filters and
//! waits forever, so no publish path of a [`Client`](crate::Client) runs until
//! its configuration is known to match the record.
//!
//! The record is written once and never changed (see
//! [`FenceStore::record_partitions`]), so a match, once seen, is kept for the
//! life of the client and its clones: a verified publish costs one atomic
//! load, no PostgreSQL round trip. Until then (nothing recorded at connect)
//! each publish path records the configuration first, or fails with
//! [`FenceError::PartitionsChanged`] if a worker or client recorded another
//! one meanwhile; nothing is written before that check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::fence::{FenceError, FenceStore};

/// A client's configured way of owning jobs and whether the namespace's
/// record is known to match it. Shared by a client's clones.
#[derive(Debug, Clone)]
pub(crate) struct ModeCheck {
    configured: Option<u32>,
    matched: Arc<AtomicBool>,
}

impl ModeCheck {
    /// Checks `configured` against the record at connect. A namespace that
    /// records nothing yet (not migrated, or migrated by
    /// [`FenceStore::migrate`] alone) is not recorded here: a client that only
    /// reads never decides the namespace's mode; its first publish does.
    ///
    /// # Errors
    /// [`FenceError::PartitionsChanged`]; [`FenceError::Db`].
    pub(crate) async fn at_connect(
        store: &FenceStore,
        configured: Option<u32>,
    ) -> Result<Self, FenceError> {
        let matched = store.check_partitions(configured).await?;
        Ok(ModeCheck {
            configured,
            matched: Arc::new(AtomicBool::new(matched)),
        })
    }

    /// Records the configured way (if the namespace has none yet) and checks
    /// it against the record.
    ///
    /// # Errors
    /// As [`FenceStore::record_partitions`].
    pub(crate) async fn record(&self, store: &FenceStore) -> Result<(), FenceError> {
        store.record_partitions(self.configured).await?;
        self.matched.store(true, Ordering::Release);
        Ok(())
    }

    /// Before any publish path writes anything: `Ok` once the record is known
    /// to match (no round trip); otherwise as [`ModeCheck::record`].
    ///
    /// # Errors
    /// [`FenceError::PartitionsChanged`]; [`FenceError::Db`] (a schema not
    /// migrated yet: nothing can be enqueued into it anyway).
    pub(crate) async fn before_publish(&self, store: &FenceStore) -> Result<(), FenceError> {
        if self.matched.load(Ordering::Acquire) {
            return Ok(());
        }
        self.record(store).await
    }
}
