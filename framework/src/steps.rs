//! Step-list versions: whether a worker's definition of a job type may resume
//! a job row, given the step names the row recorded and how many steps
//! committed.
//!
//! Below `job` and `fence`, which both use it: a job's `STEPS` are
//! [`StepInfo`]s, and the row records their names and [`fingerprint`]. Public
//! as `tenure::job::StepInfo` and `tenure::job::step_list::fingerprint`.
//!
//! A job row records the step names of the definition it was enqueued with
//! (see [`JobRow::step_names`](crate::JobRow::step_names)). A definition *fits*
//! a row when
//! * the steps already committed are the same steps, in the same order, at the
//!   start of the definition (a renamed or reordered committed step would feed
//!   a checkpoint into the wrong code), and
//! * the definition is not shorter than the recorded list (it would end the job
//!   before steps it was enqueued with).
//!
//! So appending steps, and changing steps not committed yet, fit; a row with no
//! recorded list (enqueued by name, or before step lists were recorded) fits
//! every definition and records the first claimer's.

/// Static facts about one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepInfo {
    /// The step's name (the method name).
    pub name: &'static str,
}

/// How a definition relates to a row's recorded step list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fit {
    /// The recorded list is this definition's: nothing to write.
    Same,
    /// The definition may resume the row; the row should record it.
    Compatible,
    /// The definition must not resume the row; the reason says why.
    Incompatible(String),
}

/// The names of `steps`, as a row records them.
pub(crate) fn names(steps: &[StepInfo]) -> Vec<String> {
    steps.iter().map(|s| s.name.to_string()).collect()
}

/// A short, stable digest of a step list: FNV-1a (64 bit) over the names, each
/// followed by a NUL byte, as 16 hex digits. Equal lists have equal
/// fingerprints; it is for display and quick comparison, not for security.
pub fn fingerprint<S: AsRef<str>>(names: &[S]) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for name in names {
        for byte in name.as_ref().bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    format!("{hash:016x}")
}

/// Whether `own` fits a row that recorded `recorded` and committed `committed`
/// steps.
pub(crate) fn fit(recorded: Option<&[String]>, committed: usize, own: &[StepInfo]) -> Fit {
    let Some(recorded) = recorded else {
        return Fit::Compatible;
    };
    let own_names: Vec<&str> = own.iter().map(|s| s.name).collect();
    if recorded
        .iter()
        .map(String::as_str)
        .eq(own_names.iter().copied())
    {
        return Fit::Same;
    }
    if committed > own.len() {
        return Fit::Incompatible(format!(
            "{committed} steps committed, but this definition has only {}",
            own.len()
        ));
    }
    let done = &recorded[..committed.min(recorded.len())];
    if !done
        .iter()
        .map(String::as_str)
        .eq(own_names[..done.len()].iter().copied())
    {
        return Fit::Incompatible(format!(
            "the committed steps {done:?} are not the first steps of this definition"
        ));
    }
    if own.len() < recorded.len() {
        return Fit::Incompatible(format!(
            "this definition ends after {} steps, the job's has {}",
            own.len(),
            recorded.len()
        ));
    }
    Fit::Compatible
}

/// The dead-letter reason of a job no compatible worker took within the grace:
/// names both step lists.
pub(crate) fn changed_reason(
    recorded: &[String],
    committed: usize,
    own: &[StepInfo],
    why: &str,
) -> String {
    let own: Vec<&str> = own.iter().map(|s| s.name).collect();
    format!(
        "definition_changed: the job's steps {recorded:?} ({committed} committed) do not fit \
         this worker's {own:?}: {why}; no worker with a compatible definition took it within \
         the grace"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(names: &'static [&'static str]) -> Vec<StepInfo> {
        names.iter().map(|name| StepInfo { name }).collect()
    }

    fn rec(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_row_without_a_list_fits_every_definition() {
        assert_eq!(fit(None, 2, &steps(&["x"])), Fit::Compatible);
    }

    #[test]
    fn the_same_list_needs_no_write() {
        let r = rec(&["a", "b", "c"]);
        assert_eq!(fit(Some(&r), 1, &steps(&["a", "b", "c"])), Fit::Same);
    }

    #[test]
    fn appended_steps_fit() {
        let r = rec(&["a", "b", "c"]);
        assert_eq!(
            fit(Some(&r), 2, &steps(&["a", "b", "c", "d"])),
            Fit::Compatible
        );
    }

    #[test]
    fn reordered_or_renamed_committed_steps_do_not_fit() {
        let r = rec(&["a", "b", "c"]);
        assert!(matches!(
            fit(Some(&r), 2, &steps(&["b", "a", "c"])),
            Fit::Incompatible(_)
        ));
        assert!(matches!(
            fit(Some(&r), 2, &steps(&["a", "x", "c"])),
            Fit::Incompatible(_)
        ));
    }

    #[test]
    fn changes_after_the_committed_steps_fit() {
        let r = rec(&["a", "b", "c"]);
        assert_eq!(fit(Some(&r), 1, &steps(&["a", "x", "c"])), Fit::Compatible);
        assert_eq!(fit(Some(&r), 0, &steps(&["c", "b", "a"])), Fit::Compatible);
    }

    #[test]
    fn a_shorter_definition_does_not_fit() {
        let r = rec(&["a", "b", "c", "d"]);
        assert!(matches!(
            fit(Some(&r), 1, &steps(&["a", "b", "c"])),
            Fit::Incompatible(why) if why.contains("ends after 3 steps")
        ));
        assert!(matches!(
            fit(Some(&r), 4, &steps(&["a", "b", "c"])),
            Fit::Incompatible(_)
        ));
    }

    #[test]
    fn fingerprints_differ_for_different_lists_and_are_stable() {
        assert_eq!(fingerprint(&["a", "b"]), fingerprint(&rec(&["a", "b"])));
        assert_ne!(fingerprint(&["a", "b"]), fingerprint(&["b", "a"]));
        // The NUL separator: ["ab"] is not ["a", "b"].
        assert_ne!(fingerprint(&["ab"]), fingerprint(&["a", "b"]));
        assert_eq!(fingerprint::<&str>(&[]), "cbf29ce484222325");
    }

    #[test]
    fn the_reason_names_both_lists() {
        let r = rec(&["a", "b"]);
        let why = changed_reason(&r, 1, &steps(&["x", "b"]), "why");
        assert!(why.starts_with("definition_changed"));
        assert!(why.contains(r#"["a", "b"]"#) && why.contains(r#"["x", "b"]"#));
    }
}
