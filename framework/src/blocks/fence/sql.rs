//! The SQL text of every statement, qualified with the store's schema once, at
//! construction. Runtime `query()` only: the build never needs a database.

/// Columns of a full [`JobRow`](super::JobRow).
pub(crate) const ROW_COLUMNS: &str = "id, job_type, input, fence, step, checkpoint, status, released, \
                           takeovers, attempts, last_error, cancel_reason, created_at, updated_at, run_at, awaiting_publish, \
                           step_names, steps_fingerprint, incompatible_since, compensation, priority";

/// Columns a claim returns.
#[cfg(feature = "testing")]
const CLAIM_RETURNING: &str = "job_type, input, step, checkpoint, status, takeovers, attempts, prev_fence, took_over, \
     step_names, (extract(epoch FROM clock_timestamp() - incompatible_since) * 1000)::bigint \
     AS incompatible_ms";

/// SQLSTATE raised by `tenure_step_cas` when the step CAS matches no row.
pub(crate) const CAS_REFUSED_SQLSTATE: &str = "TF002";

/// `text` as a PostgreSQL string literal that means the same whatever
/// `standard_conforming_strings` says: `E'...'` with backslashes and quotes
/// doubled. (JSON text never holds a NUL byte: serde escapes control characters.)
pub(crate) fn quote_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    out.push_str("E'");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The job id, token and step as typed literals (`$1`..`$3` of the admission
/// and of the step CAS).
fn key_literals(id: uuid::Uuid, token: i64, step: i32) -> [String; 3] {
    [
        format!("'{id}'::uuid"),
        format!("{token}::bigint"),
        format!("{step}::int"),
    ]
}

/// `template` with each `$n` replaced by `args[n - 1]`, in one pass: the text
/// of a value is never scanned for placeholders itself. A `$` not followed by
/// the number of an argument stays as it is.
fn with_literals(template: &str, args: &[&str]) -> String {
    let mut out =
        String::with_capacity(template.len() + args.iter().map(|a| a.len()).sum::<usize>());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let arg = after[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| args.get(i));
        match arg {
            Some(arg) => out.push_str(arg),
            None => {
                out.push('$');
                out.push_str(&after[..digits]);
            }
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// TEST ONLY: `SET LOCAL tenure.job_id / tenure.fence` as select items, from
/// parameters `$1` (job id) and `$2` (token). The guard no longer reads them
/// (migration 0015); the negative control keeps them for its own diagnosis.
#[cfg(feature = "testing")]
const SET_GUCS: &str = "set_config('tenure.job_id', $1::text, true) AS tenure_job_id, \
                        set_config('tenure.fence', $2::text, true) AS tenure_fence";

/// TEST ONLY: the negative control's claim on table `t`, with no fence check
/// (a raw `UPDATE`, as the test's superuser): it takes the row whatever its
/// fence, never lowering it (the update wall of migration 0015 refuses that).
/// SET expressions all read the OLD row version.
#[cfg(feature = "testing")]
fn unfenced_claim_sql(t: &str) -> String {
    format!(
        "UPDATE {t} SET prev_fence = fence, \
                        took_over = (fence > 0 AND NOT released), \
                        takeovers = takeovers + (fence > 0 AND NOT released)::int, \
                        fence = greatest(fence, $2), released = false, status = 'running', \
                        updated_at = now() \
         WHERE id = $1 AND status IN ('pending', 'running') \
         RETURNING {CLAIM_RETURNING}"
    )
}

/// A call of one of `schema`'s SECURITY DEFINER functions, its rows as the
/// statement's: every change of a row's status or fence is one (migration
/// 0015), so these statements only call them.
fn definer_call(schema: &str, call: &str) -> String {
    format!("SELECT * FROM \"{schema}\".{call}")
}

#[derive(Debug)]
pub(crate) struct Sql {
    /// Partition mode ([`Sql::partitioned`]): a claim accepts the row's own
    /// token (the partition owner claims each of its jobs with one token).
    pub partitioned: bool,
    pub insert: String,
    pub same_payload: String,
    pub job: String,
    pub jobs: String,
    pub list: String,
    pub diag: String,
    pub claim: String,
    pub claim_and_begin: String,
    pub admit: String,
    /// The step CAS as a statement that, sent before `COMMIT` in one simple
    /// query, makes the `COMMIT` happen only if it matched (parameters `$1` id,
    /// `$2` token, `$3` step, `$4` output, `$5` last; see [`Sql::step_cas_literal`]).
    pub step_cas: String,
    pub fail: String,
    pub release: String,
    /// A compatible claim's step list (migration 0012): `$3` names, `$4`
    /// fingerprint; clears the incompatibility mark.
    pub record_steps: String,
    /// Marks since when no compatible worker took the job (kept if set).
    pub mark_incompatible: String,
    pub dead: String,
    pub dead_unfenced: String,
    pub redrive: String,
    pub cancel: String,
    /// Compensation (migration 0011, `compensation.rs`).
    pub claim_compensation: String,
    pub compensation_state: String,
    pub admit_compensation: String,
    pub finish_compensation: String,
    pub guard_function: String,
}

impl Sql {
    /// `schema` must already be validated (see `super::guard::check_schema`).
    pub(crate) fn new(schema: &str) -> Self {
        let t = format!("\"{schema}\".jobs");
        let k = format!("\"{schema}\".job_tombstones");
        let f = |call: &str| definer_call(schema, call);
        Sql {
            partitioned: false,
            insert: format!(
                "INSERT INTO {t} (id, job_type, input, run_at, awaiting_publish, step_names, \
                                  steps_fingerprint, trace_context, priority) \
                 SELECT $1, $2, $3, $4, coalesce($4 > clock_timestamp(), false), $5, $6, $7, $8 \
                  WHERE NOT EXISTS (SELECT 1 FROM {k} WHERE id = $1) \
                 ON CONFLICT (id) DO NOTHING"
            ),
            same_payload: format!(
                "SELECT same, status, tombstone FROM ( \
                   SELECT (job_type = $2 AND input = $3) AS same, status, false AS tombstone \
                     FROM {t} WHERE id = $1 \
                   UNION ALL \
                   SELECT (job_type = $2 AND input_md5 = md5($3::jsonb::text)), status, true \
                     FROM {k} WHERE id = $1) found \
                 ORDER BY tombstone LIMIT 1"
            ),
            job: format!("SELECT {ROW_COLUMNS} FROM {t} WHERE id = $1"),
            jobs: format!("SELECT {ROW_COLUMNS} FROM {t} WHERE id = ANY($1)"),
            list: format!(
                "SELECT {ROW_COLUMNS} FROM {t} WHERE ($1::text IS NULL OR status = $1) \
                 ORDER BY created_at, id LIMIT $2"
            ),
            diag: format!("SELECT fence, step, status, released FROM {t} WHERE id = $1"),
            claim: f("tenure_claim($1, $2, false, false)"),
            claim_and_begin: f("tenure_claim($1, $2, false, true)"),
            // Zero rows when not admitted; the admission locks the row FOR
            // UPDATE and records the transaction for the guard.
            admit: format!("SELECT a FROM \"{schema}\".tenure_admit($1, $2, $3) a WHERE a"),
            // `tenure_step_cas` (migrations 0003, 0015) raises SQLSTATE TF002
            // when the CAS matches no row or runs outside its admission.
            step_cas: format!("SELECT \"{schema}\".tenure_step_cas($1, $2, $3, $4, $5)"),
            fail: f("tenure_fail($1, $2, $3)"),
            release: f("tenure_release($1, $2)"),
            record_steps: f("tenure_record_steps($1, $2, $3, $4)"),
            mark_incompatible: f("tenure_mark_incompatible($1, $2)"),
            // `$4`: the job type has an `on_dead` hook (0011): its compensation
            // is pending from this very statement on.
            dead: f("tenure_mark_dead($1, $2, $3, $4)"),
            dead_unfenced: f("tenure_mark_dead_unfenced($1, $2, $3)"),
            redrive: f("tenure_redrive($1, $2)"),
            // Operator cancel (migrations 0007, 0015): no token, the row lock
            // orders it after any open step transaction; every fenced statement
            // after its commit finds a terminal row. A delayed job waiting for
            // its `run_at` (0008) is taken off the scheduler's due list. A dead
            // job can be cancelled too (an operator gives up on it: never
            // redriven), unless its compensation is pending.
            cancel: f("tenure_cancel($1, $2)"),
            guard_function: format!("\"{schema}\".tenure_guard()"),
            claim_compensation: f("tenure_claim_compensation($1, $2)"),
            compensation_state: format!("SELECT fence, compensation FROM {t} WHERE id = $1"),
            admit_compensation: format!(
                "SELECT step FROM \"{schema}\".tenure_admit_compensation($1, $2) step"
            ),
            finish_compensation: f("tenure_finish_compensation($1, $2)"),
        }
    }

    /// The step CAS with its values written as literals, for a simple-query
    /// string that goes on with `COMMIT` (see `FencedTx::commit_step`): the id,
    /// the token, the step, the output's JSON text in an `E'..'` literal, and
    /// `last`.
    pub(crate) fn step_cas_literal(
        &self,
        id: uuid::Uuid,
        token: i64,
        step: i32,
        output: &serde_json::Value,
        last: bool,
    ) -> String {
        let [id, token, step] = key_literals(id, token, step);
        let output = format!("{}::jsonb", quote_literal(&output.to_string()));
        let last = if last { "true" } else { "false" };
        with_literals(&self.step_cas, &[&id, &token, &step, &output, last])
    }

    /// The admission statement with its three parameters written as literals,
    /// for a simple-query string that also ends the previous step's transaction
    /// (see `FencedTx::commit_step_and_begin`). Only typed values go in: a
    /// UUID's canonical text, and two integers.
    pub(crate) fn admit_literal(&self, id: uuid::Uuid, token: i64, step: i32) -> String {
        let [id, token, step] = key_literals(id, token, step);
        with_literals(&self.admit, &[&id, &token, &step])
    }

    /// Partition mode: the claim raises the fence to the partition owner's
    /// token or finds it there already (`fence <= $2`), and counts a takeover
    /// only from an older owner that did not release (`fence < $2`). The same
    /// token on the row is the same owner (its earlier attempt of the job);
    /// two owners never share a token (`FenceStore::claim_partition`).
    pub(crate) fn partitioned(mut self, schema: &str) -> Self {
        self.claim = definer_call(schema, "tenure_claim($1, $2, true, false)");
        self.claim_and_begin = definer_call(schema, "tenure_claim($1, $2, true, true)");
        self.partitioned = true;
        self
    }

    /// TEST ONLY: the torture test's negative control (`Config::unsafe_no_fencing`).
    /// The claim no longer requires `fence < $token`, the admission and the step
    /// commit check neither the fence nor the step nor the status, so a stale
    /// owner's step is admitted and committed on top of its successor's.
    #[cfg(feature = "testing")]
    pub(crate) fn without_fencing(mut self, schema: &str) -> Self {
        let t = format!("\"{schema}\".jobs");
        let set_gucs = SET_GUCS;
        self.claim = unfenced_claim_sql(&t);
        self.claim_and_begin = format!("{}, {set_gucs}", self.claim);
        self.admit = format!(
            "WITH admitted AS MATERIALIZED ( \
                 SELECT id FROM {t} WHERE id = $1 AND $3::int >= 0 FOR UPDATE) \
             SELECT {set_gucs} FROM admitted"
        );
        // Never raises: the string's COMMIT always runs.
        self.step_cas = format!(
            "WITH cas AS ( \
                 UPDATE {t} SET step = $3 + 1, checkpoint = $4, \
                                status = CASE WHEN $5 THEN 'done' ELSE status END, \
                                updated_at = now() \
                 WHERE id = $1 AND $2 IS NOT NULL RETURNING 1) \
             SELECT count(*) FROM cas"
        );
        self
    }
}

#[cfg(test)]
mod tests {
    use super::Sql;

    #[test]
    fn the_literal_admission_has_no_parameters_left_and_quotes_only_the_uuid() {
        let sql = Sql::new("tenure");
        let id = uuid::Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);
        let text = sql.admit_literal(id, 42, 7);
        assert!(!text.contains('$'), "{text}");
        assert_eq!(
            text,
            "SELECT a FROM \"tenure\".tenure_admit('12345678-9abc-def0-1234-56789abcdef0'::uuid, \
             42::bigint, 7::int) a WHERE a"
        );
    }

    #[test]
    fn placeholders_are_filled_once_and_a_values_own_dollars_stay() {
        assert_eq!(
            super::with_literals("a $1 b $2 $1 $3 $x $", &["'$2'", "2"]),
            "a '$2' b 2 '$2' $3 $x $"
        );
    }

    #[test]
    fn literals_double_quotes_and_backslashes_inside_e_quotes() {
        assert_eq!(
            super::quote_literal(r#"{"a":"it's \"q\" \\ é"}"#),
            r#"E'{"a":"it''s \\"q\\" \\\\ é"}'"#
        );
        let sql = Sql::new("tenure");
        let id = uuid::Uuid::from_u128(1);
        let out = serde_json::json!({"note": "O'Brien \\ done"});
        let text = sql.step_cas_literal(id, 42, 1, &out, true);
        assert_eq!(
            text,
            "SELECT \"tenure\".tenure_step_cas('00000000-0000-0000-0000-000000000001'::uuid, \
             42::bigint, 1::int, E'{\"note\":\"O''Brien \\\\\\\\ done\"}'::jsonb, true)"
        );
    }
}
