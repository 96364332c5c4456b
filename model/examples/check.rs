//! Checks the faithful model and the weakened variants at a bound, printing
//! sizes, times and counterexample traces.
//!
//! `cargo run --release -p tenure-model --example check` (the bound `make
//! test` checks), `-- larger` (three workers, three steps, two lease expiries).

use tenure_model::model::{Bound, EqualToken, Switches, Tenure};
use tenure_model::variants::{self, ADMISSION_ONLY};
use tenure_model::{Outcome, check, render};

fn summary(name: &str, out: &Outcome) {
    println!(
        "{name}: {} unique states, {} generated, max depth {} ({}), {:.2?}",
        out.unique_states,
        out.states,
        out.max_depth,
        if out.exhaustive() { "exhaustive" } else { "cut at the depth bound" },
        out.elapsed
    );
}

fn main() {
    let larger = std::env::args().any(|a| a == "larger");
    let bound = if larger { Bound::LARGER } else { Bound::SMALL };
    let depth = 200;
    println!("bound: {bound:?}");
    let model = Tenure::faithful(bound);
    let out = check(model.clone(), depth, None);
    summary("faithful", &out);
    for (name, path) in &out.discoveries {
        println!("  discovery for {name:?} ({} actions)", path.len());
    }
    if let Some(path) = out.discovery(tenure_model::props::ONE_OWNER_PER_TOKEN) {
        println!("{}", render(&model, path));
    }
    let today = Tenure {
        bound,
        switches: Switches {
            equal_token: EqualToken::AcceptAsOurs,
            ..Switches::FAITHFUL
        },
    };
    let no_restore = Tenure {
        bound: Bound {
            snapshot_restores: 0,
            ..bound
        },
        ..today
    };
    let out = check(no_restore, depth, None);
    summary("today's claim, no snapshot restore", &out);
    for name in out.discoveries.keys() {
        println!("  discovery for {name:?}");
    }
    let only = Tenure {
        bound,
        switches: ADMISSION_ONLY,
    };
    let out = check(only, depth, None);
    summary("admission without fence, CAS with it", &out);
    for name in out.discoveries.keys() {
        println!("  discovery for {name:?}");
    }
    for v in variants::ALL {
        let m = Tenure {
            bound,
            switches: v.switches,
        };
        let out = check(m.clone(), depth, Some(v.breaks));
        summary(v.name, &out);
        match out.discovery(v.breaks) {
            Some(path) => println!("  counterexample for {:?}:\n{}", v.breaks, render(&m, path)),
            None => println!("  NO counterexample for {:?}", v.breaks),
        }
    }
}
