//! nats-server 2.9's stalled consumer, and how it is cleared.
//!
//! A nats-server 2.9 killed right after a worker's ack can come back with the
//! consumer still listing the acked message as pending, while the work-queue
//! stream has already removed it (the consumer's state is written up to
//! 100 ms after the stream's; test `nats_stall`). Every redelivery of such an
//! entry fails ("Received an error looking up message for consumer: deleted
//! message": 2.9's `getNextMsg` returns the error instead of skipping the
//! entry; fixed in nats-server 2.10.25 and 2.11), the entry stays pending and
//! comes due again every AckWait, and with a few of them the consumer delivers
//! nothing else (seen in a torture run: two jobs' messages stored and never
//! delivered for four minutes, `lost=2`).
//!
//! [`Queue::clear_deleted_pending`] acks, on the consumer, every sequence
//! between its ack floor and its last delivery that the stream no longer
//! holds: the ack takes the entry out of the consumer's pending set. Such a
//! sequence cannot come back (a work-queue stream never reuses one), and an
//! ack of a sequence that is neither stored nor pending changes nothing, so
//! no live message is ever acked. The scheduler leader runs it on a consumer
//! that made no progress for an AckWait while it had redelivered entries
//! pending ([`Progress::stuck_since`]).

use super::{Queue, QueueError, boxed};

/// At most this many sequences are looked at per clearing (a consumer further
/// behind is cleared over several rounds).
const MAX_SCAN: u64 = 10_000;

/// Where a work-stream consumer stands, from its info.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    /// The last stream sequence delivered.
    pub(crate) delivered: u64,
    /// The stream sequence below which everything is acked.
    pub(crate) ack_floor: u64,
    /// Delivered and not acked.
    pub(crate) ack_pending: u64,
    /// Pending entries delivered more than once.
    pub(crate) redelivered: u64,
}

impl Progress {
    /// Whether the consumer looks stalled now, seen `before` (an AckWait or
    /// more ago): redelivered entries pending, and neither its deliveries nor
    /// its acks moved since.
    pub(crate) fn stuck_since(&self, before: &Progress) -> bool {
        self.ack_pending > 0
            && self.redelivered > 0
            && self.delivered == before.delivered
            && self.ack_floor == before.ack_floor
    }
}

impl Queue {
    /// Every consumer of the work stream (per type, per partition), by name,
    /// and where it stands.
    ///
    /// # Errors
    /// [`QueueError::Read`].
    pub(crate) async fn consumer_progress(&self) -> Result<Vec<(String, Progress)>, QueueError> {
        use futures::StreamExt;
        let name = &self.inner.names.stream;
        let mut infos = self.inner.work_stream.consumers();
        let mut out = Vec::new();
        while let Some(info) = infos.next().await {
            let info = info.map_err(|e| QueueError::Read {
                stream: name.clone(),
                source: boxed(e),
            })?;
            let progress = Progress {
                delivered: info.delivered.stream_sequence,
                ack_floor: info.ack_floor.stream_sequence,
                ack_pending: u64::try_from(info.num_ack_pending).unwrap_or(0),
                redelivered: u64::try_from(info.num_redelivered).unwrap_or(0),
            };
            out.push((info.name, progress));
        }
        Ok(out)
    }

    /// Acks, on `consumer`, every stream sequence after its ack floor and up
    /// to its last delivery (`at`) that the work stream no longer holds;
    /// returns how many (see the module docs).
    ///
    /// # Errors
    /// [`QueueError::Read`] if a sequence cannot be looked up,
    /// [`QueueError::Publish`] if an ack cannot be sent.
    pub(crate) async fn clear_deleted_pending(
        &self,
        consumer: &str,
        at: Progress,
    ) -> Result<usize, QueueError> {
        let names = &self.inner.names;
        let last = at.delivered.min(at.ack_floor.saturating_add(MAX_SCAN));
        let mut cleared = 0;
        for seq in at.ack_floor.saturating_add(1)..=last {
            let stored = self
                .get_stored(&self.inner.work_stream, &names.stream, seq, None)
                .await?;
            if stored.is_none() {
                self.ack_missing(consumer, seq).await?;
                cleared += 1;
            }
        }
        Ok(cleared)
    }

    /// An ack of stream sequence `seq` on `consumer`, by its ack subject
    /// (`$JS.ACK.<stream>.<consumer>.<deliveries>.<stream seq>.<consumer
    /// seq>.<time>.<pending>`; the server reads the stream sequence; a
    /// consumer sequence of 0 never moves the ack floor).
    async fn ack_missing(&self, consumer: &str, seq: u64) -> Result<(), QueueError> {
        let subject = format!(
            "$JS.ACK.{}.{consumer}.1.{seq}.0.0.0",
            self.inner.names.stream
        );
        let client = &self.inner.client;
        let sent = client.publish(subject.clone(), bytes::Bytes::new()).await;
        sent.map_err(|e| QueueError::Publish {
            subject,
            source: boxed(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Progress;

    fn at(delivered: u64, ack_floor: u64, ack_pending: u64, redelivered: u64) -> Progress {
        Progress {
            delivered,
            ack_floor,
            ack_pending,
            redelivered,
        }
    }

    #[test]
    fn only_a_consumer_that_did_not_move_with_redelivered_entries_is_stuck() {
        let before = at(10, 4, 6, 6);
        assert!(at(10, 4, 6, 6).stuck_since(&before));
        assert!(!at(11, 4, 6, 6).stuck_since(&before), "it delivered");
        assert!(!at(10, 5, 5, 6).stuck_since(&before), "it acked");
        assert!(
            !at(10, 4, 6, 0).stuck_since(&before),
            "a long job's message, never redelivered"
        );
        assert!(!at(10, 10, 0, 0).stuck_since(&at(10, 10, 0, 0)), "idle");
    }
}
