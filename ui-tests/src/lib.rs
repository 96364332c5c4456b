//! Nothing to import: this package holds `tests/ui.rs`, tenure's trybuild
//! cases, in a package of their own so that trybuild builds tenure with only
//! the features these cases need (see `Cargo.toml`).
