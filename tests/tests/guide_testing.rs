//! The complete example of the guide "Testing your jobs"
//! (`tenure::guide::testing`), run as a test: the guide shows the included
//! file verbatim, so the two cannot drift apart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

include!("../../framework/src/docs/testing_example.rs");
