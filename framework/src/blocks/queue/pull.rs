//! Pull requests that never wait at the server.
//!
//! Every pull request is `no_wait` without `expires`. nats-server answers it
//! at once: `404 No Messages` when nothing is ready for the consumer, else
//! what is ready (up to the batch), ended by a `408` or by the batch filling
//! up. A fetch that may wait ([`Queue::fetch`], the max-deliveries listener)
//! asks again every poll period (`Tuning::fetch_wait_several`), and at once
//! when the doorbell rings for its job type (`ring.rs`), until a request
//! delivers something or its wait has passed: the waiting is the client's,
//! and no request is left at the server when the call returns.
//!
//! Why: a request that waits at the server (`expires`) and expires within
//! about a millisecond of a redelivery becoming due (a nak delay ending) is
//! mishandled by nats-server 2.9.10: the request may go unanswered past its
//! expiry, and the redelivery is lost until `AckWait`, with a delivery count
//! that is off by one either way (test
//! `queue::a_nak_delay_ending_with_a_fetch_wait_loses_no_redelivery`: 4 or
//! 5 of its 24 trials in each of five runs with waiting requests).
//!
//! One case is left where the server keeps a `no_wait` request: it counted a
//! message as ready, and that message then went over `MaxDeliver` (the server
//! drops it and raises the advisory instead). The request then waits with
//! nothing to deliver and no expiry (seen: unanswered for 3 s). [`Reading`]
//! tells it apart from a slow or silent server with a probe: when the
//! request has heard nothing for its quiet bound (the caller's wait, at least
//! a poll period), a second `no_wait` request that can take no message
//! (`max_bytes` 1) goes to the same consumer. The server handles a consumer's
//! requests in order and sends a request's messages and statuses through one
//! queue, so a `404` to the probe, with nothing heard on the first request,
//! proves the server holds the first with nothing ready for it: it is dropped.
//! Any other answer keeps us listening; a server that answers neither by the
//! quiet bound + `Config::nats_request_timeout` fails the fetch, as a waiting
//! request did (partition mode suspects NATS from such errors; test
//! `queue::a_fetch_from_a_paused_nats_fails_instead_of_finding_nothing`). A
//! dropped request takes nothing with it: before it delivers, the server
//! checks that the request's reply subject still has a subscriber, which it
//! does not once we unsubscribed (seen: a redelivery that came due while the
//! only request the server kept had lost its subscriber came at its delay).
//! Only a message that becomes ready in the instant between the probe's
//! answer and the drop is lost until `AckWait`.

use std::time::Duration;

use async_nats::StatusCode;
use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use tokio::time::Instant;

use super::{Cause, Queue, QueueError, boxed};

/// What one pull request has heard so far, and whether to listen on: a pure
/// state machine, fed by [`Queue::pull`].
#[derive(Debug)]
struct Reading {
    max: usize,
    got: usize,
    probe: Probe,
}

/// The probe of a request that heard nothing (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    NotSent,
    Sent,
    /// Answered with something other than a proof that the request was left.
    Answered,
}

/// What the server, or the clock, said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Heard {
    /// A message of the batch.
    Message,
    /// A status: `404`, `408`, `409`, `100` (idle heartbeat), ...
    Status(u16),
    /// The subscription ended (the client is closing).
    Closed,
    /// A status on the probe's inbox.
    Probed(u16),
    /// The bound of [`Reading::until`] passed.
    Elapsed,
}

/// What to do after hearing something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Listen,
    /// Nothing came within the quiet bound: send the probe.
    SendProbe,
    /// The probe answered without proving anything: unsubscribe it, listen on.
    ProbeDone,
    /// The server ended the request, or the batch is full.
    Ended,
    /// The probe proved that the server keeps the request with nothing to
    /// deliver: drop it.
    Left,
    /// The server refused the request before sending anything.
    Refused(u16),
    /// Messages came, but the end of the request did not within its bound.
    Overdue,
    /// Nothing came on the request by its bound, and the probe proved nothing.
    Unanswered,
}

impl Reading {
    fn new(max: usize) -> Self {
        Reading {
            max,
            got: 0,
            probe: Probe::NotSent,
        }
    }

    /// Listen until `quiet_at` while nothing has come and no probe went out,
    /// until `overdue_at` after.
    fn until(&self, quiet_at: Instant, overdue_at: Instant) -> Instant {
        if self.got == 0 && self.probe == Probe::NotSent {
            quiet_at
        } else {
            overdue_at
        }
    }

    fn heard(&mut self, heard: Heard) -> Next {
        match heard {
            Heard::Message => {
                self.got += 1;
                if self.got >= self.max {
                    Next::Ended
                } else {
                    Next::Listen
                }
            }
            Heard::Status(100) => Next::Listen,
            Heard::Status(404 | 408) | Heard::Closed => Next::Ended,
            Heard::Status(code) if self.got == 0 => Next::Refused(code),
            Heard::Status(_) => Next::Ended,
            Heard::Probed(404) if self.got == 0 => Next::Left,
            Heard::Probed(_) => {
                self.probe = Probe::Answered;
                Next::ProbeDone
            }
            Heard::Elapsed if self.got > 0 => Next::Overdue,
            Heard::Elapsed if self.probe == Probe::NotSent => {
                self.probe = Probe::Sent;
                Next::SendProbe
            }
            Heard::Elapsed => Next::Unanswered,
        }
    }
}

impl Queue {
    /// Pulls every poll period, and at once when the doorbell rings for
    /// `job_type` (`ring.rs`; `None`: the advisory stream, which has none),
    /// until a request delivers something or `wait` has passed: what the
    /// first such request delivered (at most `max`), or an empty `Vec` at
    /// `wait`.
    ///
    /// # Errors
    /// [`QueueError::Disconnected`] when NATS stays down for the rest of
    /// `wait`; as [`Queue::pull`].
    pub(super) async fn poll(
        &self,
        consumer: &consumer::PullConsumer,
        (name, job_type): (&str, Option<&str>),
        max: usize,
        wait: Duration,
    ) -> Result<Vec<jetstream::Message>, QueueError> {
        let period = self.inner.settings.poll_period;
        let until = Instant::now() + wait;
        let mut ask_at = Instant::now();
        let mut rings = self.rings();
        let ringing: &[(&str, Option<u32>)] = match &job_type {
            Some(t) => &[(t, None)],
            None => &[],
        };
        loop {
            let left = until.saturating_duration_since(Instant::now());
            self.wait_connected(left).await?;
            let got = self.pull(consumer, name, max, left.max(period)).await?;
            ask_at += period;
            if !got.is_empty() {
                return Ok(got);
            }
            let next = ask_at.min(until);
            tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    if next >= until {
                        return Ok(got);
                    }
                }
                () = rings.rang(ringing), if !ringing.is_empty() => ask_at = Instant::now(),
            }
        }
    }

    /// One pull request (`no_wait`, no `expires`) for up to `max` messages,
    /// read until the server ends it. One that hears nothing for `quiet` is
    /// probed (see the module docs) and dropped, with nothing lost, if the
    /// probe proves the server keeps it with nothing to deliver.
    ///
    /// # Errors
    /// [`QueueError::Fetch`] when a request cannot be sent within `quiet` +
    /// [`Config::nats_request_timeout`](crate::Config::nats_request_timeout),
    /// the server refuses it (a status other than 404 or 408 before any
    /// message, e.g. 409 for a deleted consumer), or neither it nor its probe
    /// is answered within that.
    pub(super) async fn pull(
        &self,
        consumer: &consumer::PullConsumer,
        name: &str,
        max: usize,
        quiet: Duration,
    ) -> Result<Vec<jetstream::Message>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let err = |source| QueueError::Fetch {
            consumer: name.to_string(),
            source,
        };
        let bound = quiet + self.inner.settings.request_timeout;
        let quiet_at = Instant::now() + quiet;
        let overdue_at = Instant::now() + bound;
        let timed_out = || err(boxed(Cause::TimedOut(bound)));
        let request = Request::batch(max);
        let mut first = tokio::time::timeout_at(overdue_at, self.send_pull(consumer, request))
            .await
            .map_err(|_| timed_out())?
            .map_err(err)?;
        let mut probe: Option<async_nats::Subscriber> = None;
        let mut reading = Reading::new(max);
        let mut out = Vec::with_capacity(max.min(256));
        loop {
            let until = reading.until(quiet_at, overdue_at);
            // Biased: what the first request heard before the probe's answer
            // was sent ahead of it on the connection, so it is taken first.
            let heard = tokio::select! {
                biased;
                m = first.next() => match m {
                    Some(message) => self.hear(message, &mut out),
                    None => Heard::Closed,
                },
                m = next_on(&mut probe) => match m.and_then(|m| m.status) {
                    Some(status) => Heard::Probed(status.as_u16()),
                    None => Heard::Probed(0),
                },
                () = tokio::time::sleep_until(until) => Heard::Elapsed,
            };
            match reading.heard(heard) {
                Next::Listen => {}
                Next::SendProbe => {
                    let sent = self.send_pull(consumer, Request::probe());
                    probe = Some(
                        tokio::time::timeout_at(overdue_at, sent)
                            .await
                            .map_err(|_| timed_out())?
                            .map_err(err)?,
                    );
                }
                Next::ProbeDone => unsubscribe(probe.take()).await,
                Next::Ended => break,
                Next::Left => {
                    tracing::debug!(
                        "the server kept a no_wait pull with nothing to deliver (a message \
                         over MaxDeliver); dropped"
                    );
                    break;
                }
                Next::Refused(code) => return Err(err(boxed(Cause::Refused(code)))),
                Next::Overdue => {
                    tracing::warn!(
                        got = out.len(),
                        max,
                        "pull request not ended by the server; gave up at its deadline"
                    );
                    break;
                }
                Next::Unanswered => return Err(timed_out()),
            }
        }
        // Unsubscribing ends a request for the server, if it still has it.
        unsubscribe(probe).await;
        unsubscribe(Some(first)).await;
        Ok(out)
    }

    /// A message heard on a pull request's inbox: a delivery, kept in `out`,
    /// or a status.
    fn hear(&self, message: async_nats::Message, out: &mut Vec<jetstream::Message>) -> Heard {
        match message.status {
            None | Some(StatusCode::OK) => {
                out.push(jetstream::Message {
                    message,
                    context: self.inner.js.clone(),
                });
                Heard::Message
            }
            Some(status) => {
                if !matches!(status.as_u16(), 100 | 404 | 408) {
                    tracing::warn!(
                        %status,
                        description = ?message.description,
                        got = out.len(),
                        "pull request ended by the server"
                    );
                }
                Heard::Status(status.as_u16())
            }
        }
    }

    /// Subscribes to a fresh inbox and sends `request` with that inbox as
    /// its reply subject.
    async fn send_pull(
        &self,
        consumer: &consumer::PullConsumer,
        request: consumer::pull::BatchConfig,
    ) -> Result<async_nats::Subscriber, super::BoxError> {
        let client = &self.inner.client;
        let inbox = async_nats::Subject::from(client.new_inbox());
        let subscriber = client.subscribe(inbox.clone()).await.map_err(boxed)?;
        consumer
            .request_batch(request, inbox)
            .await
            .map_err(boxed)?;
        Ok(subscriber)
    }
}

/// The pull requests this module sends: `no_wait`, never `expires`.
struct Request;

impl Request {
    /// Up to `max` messages.
    fn batch(max: usize) -> consumer::pull::BatchConfig {
        consumer::pull::BatchConfig {
            batch: max,
            no_wait: true,
            ..Default::default()
        }
    }

    /// A request no message fits (`max_bytes` 1: the server ends it with a
    /// `409` rather than deliver), answered `404` when nothing is ready.
    fn probe() -> consumer::pull::BatchConfig {
        consumer::pull::BatchConfig {
            batch: 1,
            max_bytes: 1,
            no_wait: true,
            ..Default::default()
        }
    }
}

/// The next message on an optional subscription; pending while there is none.
async fn next_on(subscriber: &mut Option<async_nats::Subscriber>) -> Option<async_nats::Message> {
    match subscriber.as_mut() {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

async fn unsubscribe(subscriber: Option<async_nats::Subscriber>) {
    if let Some(mut s) = subscriber {
        let _ = s.unsubscribe().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(max: usize, heard: &[Heard]) -> Vec<Next> {
        let mut r = Reading::new(max);
        heard.iter().map(|h| r.heard(*h)).collect()
    }

    #[test]
    fn a_request_ends_at_the_servers_status_or_a_full_batch() {
        use Heard::*;
        assert_eq!(fed(4, &[Status(404)]), [Next::Ended]);
        assert_eq!(
            fed(4, &[Message, Message, Status(408)]),
            [Next::Listen, Next::Listen, Next::Ended]
        );
        assert_eq!(fed(2, &[Message, Message]), [Next::Listen, Next::Ended]);
        assert_eq!(fed(2, &[Status(100), Closed]), [Next::Listen, Next::Ended]);
    }

    #[test]
    fn a_refusal_is_an_error_only_before_any_message() {
        use Heard::*;
        assert_eq!(fed(4, &[Status(409)]), [Next::Refused(409)]);
        assert_eq!(fed(4, &[Message, Status(409)]), [Next::Listen, Next::Ended]);
    }

    #[test]
    fn silence_is_probed_and_only_a_404_to_the_probe_drops_the_request() {
        use Heard::*;
        assert_eq!(
            fed(4, &[Elapsed, Probed(404)]),
            [Next::SendProbe, Next::Left]
        );
        // 408: messages are ready for the first request; it will get them.
        assert_eq!(
            fed(4, &[Elapsed, Probed(408), Message, Status(408)]),
            [Next::SendProbe, Next::ProbeDone, Next::Listen, Next::Ended]
        );
        // Neither answers: the server is silent, an error.
        assert_eq!(
            fed(4, &[Elapsed, Elapsed]),
            [Next::SendProbe, Next::Unanswered]
        );
        assert_eq!(
            fed(4, &[Elapsed, Probed(409), Elapsed]),
            [Next::SendProbe, Next::ProbeDone, Next::Unanswered]
        );
        // The first request's message came before the probe's 404.
        assert_eq!(
            fed(4, &[Elapsed, Message, Probed(404), Status(408)]),
            [Next::SendProbe, Next::Listen, Next::ProbeDone, Next::Ended]
        );
    }

    #[test]
    fn messages_without_an_end_are_overdue_and_the_bound_follows_the_state() {
        use Heard::*;
        assert_eq!(fed(4, &[Message, Elapsed]), [Next::Listen, Next::Overdue]);
        let start = Instant::now();
        let (quiet, overdue) = (
            start + Duration::from_secs(1),
            start + Duration::from_secs(6),
        );
        let mut r = Reading::new(4);
        assert_eq!(r.until(quiet, overdue), quiet);
        r.heard(Elapsed);
        assert_eq!(r.until(quiet, overdue), overdue);
        let mut r = Reading::new(4);
        r.heard(Message);
        assert_eq!(r.until(quiet, overdue), overdue);
    }
}
