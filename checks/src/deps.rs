//! The module dependency rules of `ARCHITECTURE.md`, checked against `use crate::` edges.
