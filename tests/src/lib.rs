//! Shared helpers for the integration and torture tests.
