//! The step's already open transaction, handed to the step by value.
//!
//! The claim (first step) or the previous step's commit opens the next step's
//! fenced transaction in the same round trip. That transaction belongs to the
//! runtime's stage loop as an [`Offer`] until the step asks for it on its first
//! `ctx.db()` (a request over a channel, answered with a [`Handover`] that moves
//! the transaction into the step's context). A step that works elsewhere first
//! must not keep a pooled connection, the job row lock and an idle transaction
//! meanwhile: when the offer's window passes, the stage loop ends the
//! transaction (a claim is committed alone, a plain admission rolled back), a
//! state transition of the offer, not a task racing the step for a mutex.

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// The stage loop's answer to a step asking for its open transaction.
#[derive(Debug)]
pub(crate) enum Handover<T> {
    /// The transaction, now the step's.
    Tx(T),
    /// None is open (never was, or its window passed): the step opens its own.
    Ended,
    /// The claim could not be made durable on its own: after an etcd restore
    /// another acquisition may hold this very token and claim the row, so no
    /// fenced transaction may be opened under it. The attempt ends; its
    /// bookkeeping claims strictly.
    ClaimLost,
}

/// How a step asks for its open transaction: it sends where to answer.
pub(crate) type Asks<T> = mpsc::Sender<oneshot::Sender<Handover<T>>>;

/// The runtime's side of a step's open transaction.
#[derive(Debug)]
pub(super) struct Offer<T> {
    state: State<T>,
    /// When the runtime ends a transaction the step has not taken.
    until: Instant,
}

#[derive(Debug)]
enum State<T> {
    Offered(T),
    Taken,
    Ended,
    ClaimLost,
}

impl<T> Offer<T> {
    /// Offers `tx` (if one was opened for the step) until `until`.
    pub(super) fn new(tx: Option<T>, until: Instant) -> Self {
        let state = tx.map_or(State::Ended, State::Offered);
        Offer { state, until }
    }

    /// The step asks: the transaction if it is still offered.
    pub(super) fn ask(&mut self) -> Handover<T> {
        match std::mem::replace(&mut self.state, State::Taken) {
            State::Offered(tx) => Handover::Tx(tx),
            State::ClaimLost => {
                self.state = State::ClaimLost;
                Handover::ClaimLost
            }
            State::Taken | State::Ended => {
                self.state = State::Ended;
                Handover::Ended
            }
        }
    }

    /// An answer the step did not receive (its future was dropped while it
    /// asked): a transaction in it is offered again.
    pub(super) fn unanswered(&mut self, answer: Handover<T>) {
        if let Handover::Tx(tx) = answer {
            self.state = State::Offered(tx);
        }
    }

    /// When the runtime must end the offered transaction, if one is offered.
    pub(super) fn deadline(&self) -> Option<Instant> {
        matches!(self.state, State::Offered(_)).then_some(self.until)
    }

    /// The window passed: the offered transaction, for the runtime to end.
    pub(super) fn expire(&mut self) -> Option<T> {
        match std::mem::replace(&mut self.state, State::Ended) {
            State::Offered(tx) => Some(tx),
            other => {
                self.state = other;
                None
            }
        }
    }

    /// Ending the transaction lost the claim: every later ask says so.
    pub(super) fn lose_claim(&mut self) {
        self.state = State::ClaimLost;
    }

    /// After the step: the transaction it never took, if any.
    pub(super) fn leftover(self) -> Option<T> {
        match self.state {
            State::Offered(tx) => Some(tx),
            _ => None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn offer(tx: Option<u32>) -> Offer<u32> {
        Offer::new(tx, Instant::now() + Duration::from_millis(50))
    }

    #[test]
    fn a_step_that_asks_in_time_takes_the_transaction_once() {
        let mut o = offer(Some(7));
        assert!(o.deadline().is_some());
        assert!(matches!(o.ask(), Handover::Tx(7)));
        assert_eq!(o.deadline(), None, "a taken transaction has no deadline");
        assert!(
            o.expire().is_none(),
            "the runtime cannot end a taken transaction"
        );
        assert!(matches!(o.ask(), Handover::Ended));
        assert!(o.leftover().is_none());
    }

    #[test]
    fn past_the_window_the_runtime_ends_it_and_the_step_opens_its_own() {
        let mut o = offer(Some(7));
        assert_eq!(o.expire(), Some(7));
        assert!(o.expire().is_none(), "ended once");
        assert!(matches!(o.ask(), Handover::Ended));
        assert!(o.leftover().is_none());
    }

    #[test]
    fn a_lost_claim_refuses_every_later_ask() {
        let mut o = offer(Some(7));
        assert_eq!(o.expire(), Some(7));
        o.lose_claim();
        assert!(matches!(o.ask(), Handover::ClaimLost));
        assert!(matches!(o.ask(), Handover::ClaimLost));
        assert_eq!(o.deadline(), None);
    }

    #[test]
    fn an_answer_the_step_never_received_is_offered_again() {
        let mut o = offer(Some(7));
        let answer = o.ask();
        o.unanswered(answer);
        assert!(o.deadline().is_some());
        assert_eq!(o.leftover(), Some(7), "the step's commit can still use it");
    }

    #[test]
    fn without_a_transaction_there_is_nothing_to_end() {
        let mut o = offer(None);
        assert_eq!(o.deadline(), None);
        assert!(o.expire().is_none());
        assert!(matches!(o.ask(), Handover::Ended));
    }
}
