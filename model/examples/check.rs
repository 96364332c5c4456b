//! Checks the faithful model and the weakened variants at a bound, printing
//! sizes, times and counterexample traces.
//!
//! ```text
//! cargo run --release -p tenure-model --example check             # Bound::SMALL (what `make test` checks)
//! cargo run --release -p tenure-model --example check -- larger   # Bound::LARGER
//! ```
//! Add `faithful` to check only the faithful protocol (safety, deadlocks and
//! AG EF liveness), and `workers=3 steps=3 expiries=2 aborts=1 restores=1
//! phantoms=1 max_takeovers=1 jobs=2` to change any part of the bound.

use tenure_model::liveness::check_always_finishable;
use tenure_model::model::{Bound, EqualToken, Switches, Tenure};
use tenure_model::variants::{self, ADMISSION_ONLY};
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
    let bound = if args.iter().any(|a| a == "larger") {
        Bound::LARGER
    } else {
        Bound::SMALL
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
            _ => {}
        }
    }
    let faithful_only = args.iter().any(|a| a == "faithful");
    println!("bound: {bound:?}");
    let model = Tenure::faithful(bound);
    let out = check(model.clone(), DEPTH, None);
    summary("faithful", &out);
    liveness("faithful", &model);
    if faithful_only {
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
        let m = Tenure {
            bound,
            switches: v.switches,
        };
        let out = check(m.clone(), DEPTH, Some(v.breaks));
        summary(v.name, &out);
        match out.discovery(v.breaks) {
            Some(path) => println!("  counterexample for {:?}:\n{}", v.breaks, render(&m, path)),
            None => println!("  NO counterexample for {:?}", v.breaks),
        }
        liveness(v.name, &m);
    }
}
