//! The public API of `tenure` (every feature) is a checked artifact:
//! `framework/public-api.txt`. A change to the surface changes that file in the
//! same commit; `TENURE_BLESS=1 cargo test -p tenure-checks --test public_api`
//! rewrites it.

use tenure_checks::{api, workspace_root};

#[test]
fn public_api_matches_the_checked_in_listing() {
    let root = workspace_root();
    let listing = match api::list(&root.join("framework/src/lib.rs"), "tenure") {
        Ok(listing) => listing,
        Err(e) => panic!("cannot list tenure's public API: {e}"),
    };
    let file = root.join("framework/public-api.txt");
    let mut want = String::new();
    for line in &listing {
        want.push_str(line);
        want.push('\n');
    }
    if std::env::var_os("TENURE_BLESS").is_some_and(|v| v == "1") {
        if let Err(e) = std::fs::write(&file, &want) {
            panic!("cannot write {}: {e}", file.display());
        }
        return;
    }
    let have = std::fs::read_to_string(&file).unwrap_or_default();
    if have == want {
        return;
    }
    let old: Vec<&str> = have.lines().collect();
    let new: Vec<&str> = want.lines().collect();
    let mut diff = String::new();
    for line in new.iter().filter(|l| !old.contains(l)) {
        diff.push_str(&format!("+ {line}\n"));
    }
    for line in old.iter().filter(|l| !new.contains(l)) {
        diff.push_str(&format!("- {line}\n"));
    }
    panic!(
        "tenure's public API differs from framework/public-api.txt \
         (+ added, - removed):\n{diff}\n\
         If the change is intended, run with TENURE_BLESS=1 \
         (TENURE_BLESS=1 cargo test -p tenure-checks --test public_api) \
         and commit the file with the change."
    );
}

/// `blocks/mod.rs` says `ARCHITECTURE.md` lists every public item of
/// `tenure::blocks`: each item's name (not methods; the constants of
/// `headers` and `reasons` count as their module) must appear in it.
#[test]
fn architecture_names_every_public_item_of_blocks() {
    let root = workspace_root();
    let listing = match api::list(&root.join("framework/src/lib.rs"), "tenure") {
        Ok(listing) => listing,
        Err(e) => panic!("cannot list tenure's public API: {e}"),
    };
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap_or_default();
    let named = |name: &str| {
        architecture.match_indices(name).any(|(at, _)| {
            let word = |c: char| c.is_alphanumeric() || c == '_';
            let before = architecture[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !word(c));
            let after = architecture[at + name.len()..]
                .chars()
                .next()
                .is_none_or(|c| !word(c));
            before && after
        })
    };
    let missing: Vec<&String> = listing
        .iter()
        .filter(|line| !line.starts_with("method ") && !line.starts_with("assoc_"))
        .filter(|line| line.contains(" tenure::blocks::"))
        .filter(|line| !line.contains("::headers::") && !line.contains("::reasons::"))
        .filter(|line| line.rsplit("::").next().is_some_and(|name| !named(name)))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name: {missing:#?}"
    );
}
