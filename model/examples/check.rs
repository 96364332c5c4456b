//! Checks the faithful model and the weakened variants at a bound, printing
//! sizes, times and counterexample traces.
//!
//! ```text
//! cargo run --release -p tenure-model --example check             # Bound::SMALL (what `make test` checks)
//! cargo run --release -p tenure-model --example check -- larger   # Bound::LARGER
//! cargo run --release -p tenure-model --example check -- partitions           # Bound::PARTITIONS
//! cargo run --release -p tenure-model --example check -- partitions larger    # Bound::PARTITIONS_LARGER
//! ```
//! Add `faithful` to check only the faithful protocol (safety, deadlocks and
//! AG EF liveness), `bfs` to skip the AG EF check, and `workers=3 steps=3
//! expiries=2 aborts=1 restores=1 phantoms=1 max_takeovers=1 jobs=2
//! partitions=2 handovers=1` to change any part of the bound. The weakened
//! variants run at their own bounds in partition mode (`Variant::bound`), at the
//! bound given here with one lock per job.

use tenure_model::liveness::check_always_finishable;
use tenure_model::model::{Bound, EqualToken, Mode, Switches, Tenure};
use tenure_model::variants::{self, ADMISSION_ONLY, Variant};
use tenure_model::{Outcome, check, render};

const DEPTH: usize = 200;

fn summary(name: &str, out: &Outcome) {
    println!(
        "{name}: {} unique states, {} generated, max depth {} ({}), {:.2?}",
        out.unique_states,
        out.states,
        out.max_depth,
        if out.exhaustive() {
            "exhaustive"
        } else if out.stop_at.is_some() {
            "stopped at the counterexample"
        } else {
            "cut at the depth bound"
        },
        out.elapsed
    );
    for name in out.discoveries.keys() {
        println!("  discovery for {name:?}");
    }
}

fn liveness(name: &str, model: &Tenure) {
    match check_always_finishable(model, 150_000_000) {
        Ok(l) => {
            println!(
                "{name}, AG EF every job terminal: {} states, {} edges, {} job-terminal states, depth {}, {:.2?}: {}",
                l.states,
                l.edges,
                l.terminal_states,
                l.depth,
                l.elapsed,
                if l.stuck.is_some() {
                    "STUCK STATE FOUND"
                } else {
                    "holds"
                }
            );
            if let Some(path) = &l.stuck {
                println!("{}", render(model, path));
            }
        }
        Err(e) => println!("{name}, AG EF: too large ({} states)", e.states),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let larger = args.iter().any(|a| a == "larger");
    let bound = match (args.iter().any(|a| a == "partitions"), larger) {
        (true, true) => Bound::PARTITIONS_LARGER,
        (true, false) => Bound::PARTITIONS,
        (false, true) => Bound::LARGER,
        (false, false) => Bound::SMALL,
    };
    let mut bound = bound;
    for a in &args {
        let Some((key, value)) = a.split_once('=') else {
            continue;
        };
        let Ok(n) = value.parse::<u8>() else {
            continue;
        };
        match key {
            "workers" => bound.workers = usize::from(n),
            "jobs" => bound.jobs = usize::from(n),
            "steps" => bound.steps = n,
            "expiries" => bound.lease_expiries = n,
            "aborts" => bound.pg_aborts = n,
            "restores" => bound.snapshot_restores = n,
            "phantoms" => bound.phantom_grants = n,
            "max_takeovers" => bound.max_takeovers = n,
            "partitions" => bound.mode = Mode::Partitions(n),
            "handovers" => bound.handovers = n,
            _ => {}
        }
    }
    let faithful_only = args.iter().any(|a| a == "faithful");
    println!("bound: {bound:?}");
    let model = Tenure::faithful(bound);
    let out = check(model.clone(), DEPTH, None);
    summary("faithful", &out);
    if args.iter().any(|a| a == "bfs") {
        return;
    }
    liveness("faithful", &model);
    if faithful_only {
        return;
    }
    if bound.mode != Mode::Locks {
        for v in variants::PARTITIONS {
            variant(v.name, Tenure::faithful(v.bound), v);
        }
        return;
    }
    let today = Tenure {
        bound: Bound {
            snapshot_restores: 0,
            ..bound
        },
        switches: Switches {
            equal_token: EqualToken::AcceptAsOurs,
            ..Switches::FAITHFUL
        },
    };
    summary(
        "today's claim, no snapshot restore",
        &check(today.clone(), DEPTH, None),
    );
    let only = Tenure {
        bound,
        switches: ADMISSION_ONLY,
    };
    summary(
        "admission without fence, CAS with it",
        &check(only, DEPTH, None),
    );
    for v in variants::ALL {
        variant(v.name, Tenure::faithful(bound), v);
    }
}

/// Checks variant `v` at `base`'s bound: its counterexample, then AG EF.
fn variant(name: &str, base: Tenure, v: Variant) {
    let m = Tenure {
        switches: v.switches,
        ..base
    };
    let out = check(m.clone(), DEPTH, Some(v.breaks));
    summary(name, &out);
    match out.discovery(v.breaks) {
        Some(path) => println!("  counterexample for {:?}:\n{}", v.breaks, render(&m, path)),
        None => println!("  NO counterexample for {:?}", v.breaks),
    }
    liveness(name, &m);
}
