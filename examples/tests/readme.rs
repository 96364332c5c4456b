//! The README's first program is `examples/minimal.rs`, verbatim: the example
//! the tests run (`examples.rs`: `minimal_example_prints_its_jobs_result`) is the
//! code a reader copies, so the two cannot drift apart.
#![allow(clippy::expect_used, clippy::panic)]

/// The fenced code blocks of a Markdown text: (info string, body).
fn code_blocks(markdown: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in markdown.lines() {
        match (open.take(), line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_string(), String::new())),
            (Some(block), Some(_)) => blocks.push(block),
            (Some((info, mut body)), None) => {
                body.push_str(line);
                body.push('\n');
                open = Some((info, body));
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "README.md has an unclosed code block");
    blocks
}

#[test]
fn the_readmes_first_program_is_examples_minimal_rs() {
    let readme = include_str!("../../README.md");
    let minimal = include_str!("../minimal.rs");
    let blocks = code_blocks(readme);
    let (info, first) = blocks.first().expect("README.md has no code block");
    assert_eq!(
        info, "sh",
        "README.md must still start with `make demo` / `make test`"
    );
    assert!(
        first.starts_with("make demo") && first.contains("\nmake test"),
        "README.md's first block is not the two commands:\n{first}"
    );
    let (info, program) = blocks
        .get(1)
        .expect("README.md has no program after the commands");
    assert_eq!(
        info, "rust",
        "the second code block of README.md is not Rust"
    );
    assert!(
        program == minimal,
        "README.md's first Rust block differs from examples/minimal.rs; copy the file into \
         the README verbatim.\n--- README.md ---\n{program}\n--- examples/minimal.rs ---\n{minimal}"
    );
}
