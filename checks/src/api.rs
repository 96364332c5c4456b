//! The public API of `tenure` as a list of paths (see `framework/public-api.txt`).
