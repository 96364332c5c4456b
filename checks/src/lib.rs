//! Checks over Tenure's own source, run by `cargo test -p tenure-checks`
//! (and so by `make test`). They read the `framework` crate's files with
//! `syn`; nothing here builds or links `tenure`, so they run in seconds.
//!
//! - [`api`]: every public item of `tenure`, compared with the checked-in
//!   `framework/public-api.txt`.
//! - [`deps`]: the module dependency rules of `ARCHITECTURE.md`.

pub mod api;
pub mod deps;

use std::path::PathBuf;

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
