//! Counterexample traces as numbered, readable lines.

use stateright::Model;

use crate::model::{Action, MAX_PARTITIONS, Own, Pc, State, Status, Tenure, Tx, job_name};

fn pc_text(pc: &Pc) -> String {
    match pc {
        Pc::Idle => "idle".into(),
        Pc::Admitted { job } => format!("admitted {}", job_name(*job)),
        Pc::Created(g) => format!(
            "{} created, token {} (unverified)",
            job_name(g.job),
            g.token
        ),
        Pc::Locked(g) => format!("{} locked, token {}", job_name(g.job), g.token),
        Pc::Running {
            grant,
            step,
            tx,
            poisoned,
        } => {
            let tx = match tx {
                Tx::None => "no tx",
                Tx::Open { undo: Some(_) } => "claim tx open",
                Tx::Open { undo: None } => "step tx open",
                Tx::Aborted { .. } => "tx ended by server",
            };
            let what = if *poisoned { "poisoned" } else { "running" };
            format!(
                "{what} {} token {} at step {step} ({tx})",
                job_name(grant.job),
                grant.token
            )
        }
        Pc::Leaving { job, lock, ack } => {
            let mut parts = Vec::new();
            if *ack {
                parts.push("ack".to_string());
            }
            if let Some(g) = lock {
                parts.push(format!("release lock token {}", g.token));
            }
            format!("leaving {} ({})", job_name(*job), parts.join(", then "))
        }
    }
}

fn own_text(p: usize, own: &Own) -> String {
    match own {
        Own::None => format!("partition {p} not held"),
        Own::Created(g) => format!("partition {p} created, token {} (unverified)", g.token),
        Own::Elected(g) => format!("partition {p} elected, token {}", g.token),
        Own::Owned {
            grant,
            handover: false,
        } => format!("owns partition {p}, token {}", grant.token),
        Own::Owned {
            grant,
            handover: true,
        } => format!("handing partition {p} over, token {}", grant.token),
    }
}

/// Partition mode's changes: ownership, partition keys, `partition_fences`.
fn partition_diff(model: &Tenure, a: &State, b: &State, out: &mut Vec<String>) {
    for w in 0..model.bound.workers {
        for p in 0..MAX_PARTITIONS {
            if a.owns[w][p] != b.owns[w][p] {
                out.push(format!("w{w}: {}", own_text(p, &b.owns[w][p])));
            }
        }
    }
    for p in 0..MAX_PARTITIONS {
        let (ka, kb) = (a.etcd.partitions[p], b.etcd.partitions[p]);
        if ka != kb {
            out.push(match kb {
                Some(k) => format!(
                    "partition key {p} held by w{} token {}",
                    k.worker, k.create_revision
                ),
                None => format!("partition key {p} gone"),
            });
        }
        let (fa, fb) = (a.partition_fences[p], b.partition_fences[p]);
        if fa != fb {
            out.push(format!("partition_fences {p}: {fa} -> {fb}"));
        }
    }
}

fn status_text(s: Status) -> &'static str {
    match s {
        Status::Live => "live",
        Status::Done => "done",
        Status::Dead => "dead",
    }
}

/// What changed between two states, as short phrases.
fn diff(model: &Tenure, a: &State, b: &State) -> Vec<String> {
    let mut out = Vec::new();
    for w in 0..model.bound.workers {
        if a.workers[w] != b.workers[w] {
            out.push(format!("w{w}: {}", pc_text(&b.workers[w])));
        }
        let (la, lb) = (a.etcd.leases[w], b.etcd.leases[w]);
        if la != lb {
            out.push(if lb.alive {
                format!("w{w} new lease (epoch {})", lb.epoch)
            } else {
                format!("w{w}'s lease expired")
            });
        }
    }
    if a.etcd.revision != b.etcd.revision {
        out.push(format!(
            "etcd revision {} -> {}",
            a.etcd.revision, b.etcd.revision
        ));
    }
    for j in 0..model.bound.jobs {
        let name = job_name(u8::try_from(j).unwrap_or(0));
        let (ka, kb) = (a.etcd.locks[j], b.etcd.locks[j]);
        if ka != kb {
            out.push(match kb {
                Some(k) => format!(
                    "lock {name} held by w{} token {}",
                    k.worker, k.create_revision
                ),
                None => format!("lock {name} gone"),
            });
        }
        let (ra, rb) = (a.pg[j], b.pg[j]);
        if ra.fence != rb.fence {
            out.push(format!("row {name} fence {} -> {}", ra.fence, rb.fence));
        }
        if ra.step != rb.step {
            out.push(format!("row {name} step {} -> {}", ra.step, rb.step));
        }
        if ra.status != rb.status {
            out.push(format!("row {name} {}", status_text(rb.status)));
        }
        if ra.takeovers != rb.takeovers {
            out.push(format!("row {name} takeovers {}", rb.takeovers));
        }
        if ra.released != rb.released {
            out.push(format!(
                "row {name} {}",
                if rb.released {
                    "released (pending)"
                } else {
                    "not released"
                }
            ));
        }
        if ra.locked_by != rb.locked_by {
            out.push(match rb.locked_by {
                Some(w) => format!("row {name} locked by w{w}"),
                None => format!("row {name} unlocked"),
            });
        }
        if a.nats[j] != b.nats[j] {
            out.push(format!("message {name} acked"));
        }
        for k in 0..usize::from(model.bound.steps) {
            if a.ghost.commits[j][k] != b.ghost.commits[j][k] {
                out.push(format!(
                    "COMMIT {name} step {k} (#{})",
                    b.ghost.commits[j][k]
                ));
            }
        }
    }
    partition_diff(model, a, b, &mut out);
    if a.workers == b.workers && out.is_empty() {
        out.push("no change".into());
    }
    out
}

/// Renders a path of actions from the model's initial state as numbered lines:
/// the action (worker and the framework function it stands for) and what it
/// changed.
pub fn render(model: &Tenure, actions: &[Action]) -> String {
    let mut out = String::new();
    let Some(mut state) = model.init_states().into_iter().next() else {
        return out;
    };
    for (i, action) in actions.iter().enumerate() {
        let Some(next) = model.next_state(&state, *action) else {
            out.push_str(&format!("{:>3}. {action}: (not enabled)\n", i + 1));
            break;
        };
        out.push_str(&format!(
            "{:>3}. {action}: {}\n",
            i + 1,
            diff(model, &state, &next).join("; ")
        ));
        state = next;
    }
    out
}
