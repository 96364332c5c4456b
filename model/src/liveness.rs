//! Liveness beyond what Stateright's `eventually` checks.
//!
//! Stateright judges an `eventually` property only on paths that end (a state
//! with no successor, or the depth bound); a path that loops forever, say a
//! worker fetching, finding the lock held and nak'ing again and again, is never
//! judged. This module checks the stronger, branching property
//! **AG EF terminal**: from EVERY reachable state, some continuation reaches a
//! state where every job is `done` or `dead`. On a finite state graph that is
//! what "eventually done or dead under fair scheduling" needs: with strong
//! fairness over transitions (a step enabled infinitely often is taken
//! infinitely often), or with any scheduler that picks each enabled step with
//! some positive probability, every run then reaches the terminal states.
//!
//! It explores the whole state graph (no depth bound), storing a 64-bit
//! fingerprint, a parent and the incoming edges per state, then walks the
//! edges backwards from the terminal states. A state not reached backwards is
//! stuck: the check returns the shortest action path to one.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::time::{Duration, Instant};

use stateright::Model;

use crate::model::{Action, State, Tenure};

/// What the check found.
#[derive(Debug)]
pub struct Liveness {
    /// Reachable states.
    pub states: usize,
    /// Transitions between them.
    pub edges: usize,
    /// States where every job is terminal.
    pub terminal_states: usize,
    /// The longest shortest path from the initial state.
    pub depth: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// The shortest path to a state from which no job-terminal state is
    /// reachable, if there is one.
    pub stuck: Option<Vec<Action>>,
}

/// The state graph grew past the limit the caller set.
#[derive(Debug)]
pub struct TooLarge {
    /// States seen when the check gave up.
    pub states: usize,
}

struct Node {
    parent: u32,
    action: Option<Action>,
    depth: u32,
}

/// Checks AG EF (every job `done` or `dead`) over the whole reachable state
/// graph of `model`, giving up past `max_states` states.
///
/// # Errors
/// [`TooLarge`] when the graph has more than `max_states` states.
pub fn check_always_finishable(model: &Tenure, max_states: usize) -> Result<Liveness, TooLarge> {
    let start = Instant::now();
    let hasher = std::collections::hash_map::RandomState::new();
    let fp = |s: &State| {
        let mut h = hasher.build_hasher();
        s.hash(&mut h);
        std::hash::Hasher::finish(&h)
    };
    let mut index: HashMap<u64, u32> = HashMap::new();
    let mut nodes: Vec<Node> = Vec::new();
    let mut terminal: Vec<bool> = Vec::new();
    let mut edges: Vec<(u32, u32)> = Vec::new();
    let mut queue: VecDeque<(u32, State)> = VecDeque::new();
    for s in model.init_states() {
        let id = u32::try_from(nodes.len()).map_err(|_| TooLarge {
            states: nodes.len(),
        })?;
        if index.insert(fp(&s), id).is_none() {
            nodes.push(Node {
                parent: id,
                action: None,
                depth: 0,
            });
            terminal.push(model.all_terminal(&s));
            queue.push_back((id, s));
        }
    }
    let mut actions = Vec::new();
    while let Some((id, s)) = queue.pop_front() {
        let depth = nodes[id as usize].depth;
        actions.clear();
        model.actions(&s, &mut actions);
        for a in actions.drain(..) {
            let Some(next) = model.next_state(&s, a) else {
                continue;
            };
            let to = match index.entry(fp(&next)) {
                Entry::Occupied(e) => *e.get(),
                Entry::Vacant(e) => {
                    if nodes.len() >= max_states {
                        return Err(TooLarge {
                            states: nodes.len(),
                        });
                    }
                    let to = u32::try_from(nodes.len()).map_err(|_| TooLarge {
                        states: nodes.len(),
                    })?;
                    e.insert(to);
                    nodes.push(Node {
                        parent: id,
                        action: Some(a),
                        depth: depth + 1,
                    });
                    terminal.push(model.all_terminal(&next));
                    queue.push_back((to, next));
                    to
                }
            };
            edges.push((id, to));
        }
    }

    // Backwards from the terminal states, over reversed edges (CSR by target).
    let n = nodes.len();
    let mut start_of = vec![0u32; n + 1];
    for &(_, to) in &edges {
        start_of[to as usize + 1] += 1;
    }
    for i in 0..n {
        start_of[i + 1] += start_of[i];
    }
    let mut fill = start_of.clone();
    let mut from_of = vec![0u32; edges.len()];
    for &(from, to) in &edges {
        let slot = &mut fill[to as usize];
        from_of[*slot as usize] = from;
        *slot += 1;
    }
    let mut good = terminal.clone();
    let mut back: VecDeque<u32> = (0..n)
        .filter(|&i| terminal[i])
        .filter_map(|i| u32::try_from(i).ok())
        .collect();
    while let Some(to) = back.pop_front() {
        let (lo, hi) = (start_of[to as usize], start_of[to as usize + 1]);
        for &from in &from_of[lo as usize..hi as usize] {
            if !good[from as usize] {
                good[from as usize] = true;
                back.push_back(from);
            }
        }
    }
    // Nodes are numbered in BFS order: the first stuck one is a shallowest.
    let stuck = good.iter().position(|g| !g).map(|i| {
        let mut path = Vec::new();
        let mut at = i;
        while let Some(a) = nodes[at].action {
            path.push(a);
            at = nodes[at].parent as usize;
        }
        path.reverse();
        path
    });
    Ok(Liveness {
        states: n,
        edges: edges.len(),
        terminal_states: terminal.iter().filter(|t| **t).count(),
        depth: nodes.iter().map(|x| x.depth as usize).max().unwrap_or(0),
        elapsed: start.elapsed(),
        stuck,
    })
}
