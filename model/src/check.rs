//! Running the checker to a bound and collecting what it found.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use crate::model::{Action, Tenure};

/// What one BFS run found.
#[derive(Debug)]
pub struct Outcome {
    /// Distinct states visited.
    pub unique_states: usize,
    /// States generated (with repeats).
    pub states: usize,
    /// The deepest level the BFS reached.
    pub max_depth: usize,
    /// The depth bound it was given.
    pub depth_bound: usize,
    /// The run was told to stop at its first discovery of this property.
    pub stop_at: Option<&'static str>,
    /// Wall time.
    pub elapsed: Duration,
    /// Property name -> the action path of its discovery (a counterexample for
    /// `always`/`eventually`, an example for `sometimes`).
    pub discoveries: BTreeMap<&'static str, Vec<Action>>,
}

impl Outcome {
    /// The BFS ran out of states before the depth bound: it explored every
    /// reachable state of the model.
    pub fn exhaustive(&self) -> bool {
        self.stop_at.is_none() && self.max_depth < self.depth_bound
    }

    /// The counterexample (or example) for `property`, if found.
    pub fn discovery(&self, property: &str) -> Option<&[Action]> {
        self.discoveries.get(property).map(Vec::as_slice)
    }
}

/// Breadth-first check of `model` to `depth_bound` levels. With `stop_at`,
/// the run ends as soon as that property has a discovery (for the weakened
/// variants); otherwise it goes on until every state within the bound is seen.
pub fn check(model: Tenure, depth_bound: usize, stop_at: Option<&'static str>) -> Outcome {
    let start = Instant::now();
    let threads = 1;
    let mut builder = model
        .checker()
        .threads(threads)
        .target_max_depth(depth_bound);
    if let Some(p) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([p])));
    }
    let checker = builder.spawn_bfs().join();
    let properties = checker.model().properties();
    let discoveries = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| {
            // Cut an invariant's counterexample at its first violating state.
            let always = properties
                .iter()
                .find(|p| p.name == name && p.expectation == Expectation::Always);
            let steps = path.into_vec();
            let cut = always
                .and_then(|p| {
                    steps
                        .iter()
                        .position(|(s, _)| !(p.condition)(checker.model(), s))
                })
                .unwrap_or(steps.len());
            let actions = steps.into_iter().take(cut).filter_map(|(_, a)| a).collect();
            (name, actions)
        })
        .collect();
    Outcome {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        depth_bound,
        stop_at,
        elapsed: start.elapsed(),
        discoveries,
    }
}
