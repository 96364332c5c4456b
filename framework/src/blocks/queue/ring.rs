//! The doorbell: an idle worker hears of a new job at once instead of at
//! its next poll.
//!
//! No pull request waits at the server (`pull.rs`): an idle worker asks
//! every poll period (`Tuning::fetch_wait_several`, 100 ms), so a job
//! enqueued into an idle worker used to wait up to that long before anyone
//! asked for it. The work stream now republishes the headers of every
//! message it stores (JetStream `RePublish`, headers only) from
//! `<ns>.jobs.<tail>` to `<ns>.ring.<tail>`; each worker subscribes to
//! `<ns>.ring.>` and a fetch waiting between two asks for a source whose
//! ring came asks again at once.
//!
//! The ring only ever shortens a wait: correctness never depends on it. The
//! server sends it after the message is stored, so the ask it wakes finds
//! the message; a ring that is lost (the worker not subscribed yet, a NATS
//! user without the `<ns>.ring.>` grant, a work stream created before the
//! doorbell, to which nats-server 2.9 cannot add one (error 10052), a slow
//! subscriber's dropped messages) leaves the poll as it was. A retry due
//! after its backoff stores nothing and rings nothing: the poll finds it.

use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::broadcast;

use super::{Queue, QueueError, QueueNames, boxed};

/// The rings one worker's queue has heard, by source; kept only while a
/// fetch waits for them.
const RINGS_KEPT: usize = 256;

/// What a ring names: a job type and, in partition mode, its partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ring {
    job_type: Arc<str>,
    partition: Option<u32>,
}

impl Ring {
    /// The ring of subject `subject` (`<ns>.ring.<tail>`), if it names a
    /// job's source.
    fn parse(names: &QueueNames, subject: &str, partitioned: bool) -> Option<Ring> {
        let tail = subject.strip_prefix(&names.ring_subject_prefix)?;
        let (job_type, partition, _) = names.subject_source(tail, partitioned)?;
        Some(Ring {
            job_type: job_type.into(),
            partition,
        })
    }

    /// Whether this ring is for `job_type` (and `partition`, when given).
    fn is_for(&self, job_type: &str, partition: Option<u32>) -> bool {
        &*self.job_type == job_type && (partition.is_none() || partition == self.partition)
    }
}

/// The sending side of a queue's doorbell; fetches subscribe to it.
#[derive(Debug)]
pub(crate) struct Doorbell(broadcast::Sender<Ring>);

impl Default for Doorbell {
    fn default() -> Self {
        Doorbell(broadcast::channel(RINGS_KEPT).0)
    }
}

/// Rings heard since this listener was taken: take it before asking the
/// server, so a message stored after the ask rings it.
pub(crate) struct Rings(broadcast::Receiver<Ring>);

impl Rings {
    /// Returns when a ring for one of `sources` (job type, partition) came;
    /// at once if rings were dropped while nobody read (one may have been
    /// for us); never if the doorbell is gone.
    pub(crate) async fn rang(&mut self, sources: &[(&str, Option<u32>)]) {
        loop {
            match self.0.recv().await {
                Ok(ring) if sources.iter().any(|&(t, p)| ring.is_for(t, p)) => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}

impl Queue {
    /// A listener for the rings heard from now on.
    pub(crate) fn rings(&self) -> Rings {
        Rings(self.inner.doorbell.0.subscribe())
    }

    /// Subscribes to the namespace's rings (`<ns>.ring.>`) and passes them
    /// to the fetches waiting for them, until the connection closes. The
    /// client re-subscribes by itself after a reconnect.
    ///
    /// # Errors
    /// [`QueueError::Setup`] if the subscription could not be sent.
    pub(crate) async fn listen_for_rings(
        &self,
    ) -> Result<impl Future<Output = ()> + use<>, QueueError> {
        let mut sub = self
            .inner
            .client
            .subscribe(format!("{}>", self.inner.names.ring_subject_prefix))
            .await
            .map_err(|e| QueueError::Setup {
                what: "the doorbell subscription".into(),
                source: boxed(e),
            })?;
        let queue = self.clone();
        Ok(async move {
            let partitioned = queue.inner.settings.partitions.is_some();
            while let Some(msg) = sub.next().await {
                let names = &queue.inner.names;
                if let Some(ring) = Ring::parse(names, msg.subject.as_str(), partitioned) {
                    // No fetch waiting: nobody to wake.
                    let _ = queue.inner.doorbell.0.send(ring);
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_names_its_type_and_partition() {
        let n = QueueNames::new("ns");
        let r = Ring::parse(&n, "ns.ring.pay.transfer.3", true);
        assert_eq!(
            r,
            Some(Ring {
                job_type: "pay.transfer".into(),
                partition: Some(3)
            })
        );
        let r = Ring::parse(&n, "ns.ring.~high.pay.transfer", false);
        assert!(r.as_ref().is_some_and(|r| r.is_for("pay.transfer", None)));
        assert!(r.as_ref().is_some_and(|r| !r.is_for("pay.refund", None)));
        assert_eq!(Ring::parse(&n, "other.ring.pay", false), None);
    }

    #[test]
    fn a_partition_ring_wakes_only_its_partition() {
        let r = Ring {
            job_type: "t".into(),
            partition: Some(2),
        };
        assert!(r.is_for("t", Some(2)) && r.is_for("t", None));
        assert!(!r.is_for("t", Some(1)));
    }

    #[tokio::test]
    async fn rings_dropped_while_nobody_read_count_as_a_ring() {
        let bell = Doorbell::default();
        let mut rings = Rings(bell.0.subscribe());
        for _ in 0..=RINGS_KEPT {
            let _ = bell.0.send(Ring {
                job_type: "other".into(),
                partition: None,
            });
        }
        let rang = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            rings.rang(&[("t", None)]),
        )
        .await;
        assert!(rang.is_ok(), "a lagged listener returns at once");
    }
}
