-- The guard for the user's own tables (`FenceStore::install_guard`).
--
-- A statement on a guarded table succeeds only when
--   * this transaction set `tenure.job_id` / `tenure.fence` (a `FencedTx` does, with
--     `set_config(.., true)`, i.e. SET LOCAL) and that job row is `running`, not
--     released, and its fence equals `tenure.fence` right now; the row is read
--     `FOR SHARE`, so a concurrent claim waits for this transaction (a `FencedTx`
--     already holds the row `FOR UPDATE`, which covers it); or
--   * the escape hatch is on for THIS transaction: `tenure.guard_bypass` equals the
--     current transaction id (`FenceStore::bypass_guard`). A session-wide SET of the
--     bypass can never leak into a later transaction, whose id differs.
-- Anything else raises SQLSTATE TF001, which Tenure maps to a fenced-out error.
--
-- SECURITY DEFINER so roles that may write the user's table need no privilege on
-- `jobs`; `search_path` is pinned to this schema (then pg_temp, last) at creation.
CREATE FUNCTION tenure_guard() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_bypass  text := current_setting('tenure.guard_bypass', true);
    v_job     text := current_setting('tenure.job_id', true);
    v_fence   text := current_setting('tenure.fence', true);
    v_current bigint;
    v_status  text;
    v_release boolean;
BEGIN
    IF v_bypass IS NOT NULL AND v_bypass <> '' THEN
        IF v_bypass = txid_current()::text THEN
            RETURN NULL;
        END IF;
    END IF;

    IF v_job IS NULL OR v_job = '' OR v_fence IS NULL OR v_fence = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF001',
            MESSAGE = format('tenure guard: write to %I.%I outside a fenced transaction',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME),
            HINT = 'write through FencedTx::conn(), or use FenceStore::bypass_guard for migrations and operator fixes';
    END IF;

    IF v_fence !~ '^[0-9]{1,19}$'
       OR v_job !~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF001',
            MESSAGE = format('tenure guard: write to %I.%I with malformed tenure.job_id %L / tenure.fence %L',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME, v_job, v_fence);
    END IF;

    SELECT j.fence, j.status, j.released
      INTO v_current, v_status, v_release
      FROM jobs j
     WHERE j.id = v_job::uuid
       FOR SHARE;

    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF001',
            MESSAGE = format('tenure guard: write to %I.%I refused: job %s does not exist',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME, v_job);
    END IF;

    IF v_current <> v_fence::numeric OR v_status <> 'running' OR v_release THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF001',
            MESSAGE = format('tenure guard: write to %I.%I refused: job %s fence %s is not the current generation (fence %s, status %s, released %s)',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME, v_job, v_fence, v_current, v_status, v_release),
            DETAIL = format('job_id=%s ours=%s current=%s', v_job, v_fence, v_current);
    END IF;

    RETURN NULL;
END;
$$;
