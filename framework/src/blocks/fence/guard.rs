//! Name validation and the SQL of the guard trigger on the user's tables.

use super::error::FenceError;

/// Checks a Tenure schema name: 1-48 chars of `[a-z0-9_]`, not starting with a digit
/// (the rule of [`Config::validate`](crate::Config::validate)).
pub(crate) fn check_schema(name: &str) -> Result<(), FenceError> {
    let bad = |reason| {
        Err(FenceError::InvalidName {
            what: "schema",
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() || name.len() > 48 {
        return bad("must be 1-48 characters");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return bad("must be made of [a-z0-9_]");
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return bad("must not start with a digit");
    }
    Ok(())
}

/// Parses `table` or `schema.table` (each part `[A-Za-z_][A-Za-z0-9_]*`, at most 63
/// bytes, taken as written: case-sensitive, i.e. as the catalog stores it) and
/// returns it double-quoted, ready to splice into DDL.
pub(crate) fn quote_table(name: &str) -> Result<String, FenceError> {
    let bad = |reason| {
        Err(FenceError::InvalidName {
            what: "table",
            name: name.to_string(),
            reason,
        })
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return bad("must be `table` or `schema.table`");
    }
    let mut quoted = Vec::with_capacity(parts.len());
    for part in parts {
        if part.is_empty() || part.len() > 63 {
            return bad("each part must be 1-63 characters");
        }
        if !part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return bad("each part must be made of [A-Za-z0-9_]");
        }
        if part.starts_with(|c: char| c.is_ascii_digit()) {
            return bad("each part must not start with a digit");
        }
        quoted.push(format!("\"{part}\""));
    }
    Ok(quoted.join("."))
}

/// The trigger's name on a guarded table: one per Tenure schema, so two schemas
/// can guard the same table (a write must then satisfy both).
pub(crate) fn trigger_name(schema: &str) -> String {
    format!("\"tenure_guard_{schema}\"")
}

/// Why a table of `pg_class.relkind` `kind` cannot be guarded, if it cannot.
pub(crate) fn unguardable(kind: &str, is_partition: bool) -> Option<&'static str> {
    if kind == "p" {
        return Some(
            "it is partitioned: a write straight into a partition would not fire a \
             statement-level trigger on the parent (guard a plain table instead)",
        );
    }
    if is_partition {
        return Some(
            "it is a partition: a write through its partitioned parent would not fire \
             a statement-level trigger on it",
        );
    }
    None
}

pub(crate) fn install_sql(schema: &str, table: &str, function: &str) -> [String; 2] {
    let trigger = trigger_name(schema);
    [
        format!("DROP TRIGGER IF EXISTS {trigger} ON {table}"),
        format!(
            "CREATE TRIGGER {trigger} \
             BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} \
             FOR EACH STATEMENT EXECUTE FUNCTION {function}"
        ),
    ]
}

pub(crate) fn remove_sql(schema: &str, table: &str) -> String {
    format!("DROP TRIGGER IF EXISTS {} ON {table}", trigger_name(schema))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        assert!(check_schema("tenure").is_ok());
        assert!(check_schema("t_1").is_ok());
        for bad in [
            "",
            "1abc",
            "Tenure",
            "a-b",
            "a;drop",
            "a\"b",
            &"x".repeat(49),
        ] {
            assert!(
                matches!(
                    check_schema(bad),
                    Err(FenceError::InvalidName { what: "schema", .. })
                ),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn table_names_are_validated_and_quoted() {
        assert_eq!(quote_table("accounts").unwrap(), "\"accounts\"");
        assert_eq!(quote_table("app.Ledger_1").unwrap(), "\"app\".\"Ledger_1\"");
        for bad in [
            "",
            "a.b.c",
            ".x",
            "x.",
            "1x",
            "a b",
            "a\"; drop table x; --",
            "é",
        ] {
            assert!(
                matches!(
                    quote_table(bad),
                    Err(FenceError::InvalidName { what: "table", .. })
                ),
                "{bad:?} must be refused"
            );
        }
    }
}
