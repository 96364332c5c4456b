//! The module dependency rules of `ARCHITECTURE.md` (its section between
//! `<!-- dependency-rules:begin -->` and `<!-- dependency-rules:end -->`),
//! checked against every `use` of `tenure`'s own items in `framework/src/`:
//! fails listing each forbidden edge and each file-level import cycle.

use tenure_checks::{deps, workspace_root};

#[test]
fn module_dependencies_follow_architecture_md() {
    let root = workspace_root();
    let arch = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let rules = deps::parse_rules(&arch).unwrap_or_else(|e| panic!("ARCHITECTURE.md: {e}"));
    let files = deps::load_crate(&root.join("framework/src")).unwrap_or_else(|e| panic!("{e}"));
    let report = deps::check(&files, &rules).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        report.is_clean(),
        "framework/src breaks the dependency rules of ARCHITECTURE.md \
         (the table between `{}` and `{}`):\n{report}",
        deps::BEGIN,
        deps::END
    );
}
