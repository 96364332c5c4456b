-- The guard's escape hatch becomes a privilege (issue 17). Before, any session
-- could open it with `set_config('tenure.guard_bypass', txid_current()::text,
-- true)`: application code running as the worker role could forge its way past
-- a guard. Now the bypass is a row in `guard_bypass` for the current
-- transaction id, which only `tenure_bypass_guard()` writes. That function is
-- SECURITY DEFINER (it runs as the schema's owner, the migrator) and EXECUTE on
-- it is revoked from PUBLIC: only the owner, superusers and roles granted it
-- (`GRANT EXECUTE ON FUNCTION <schema>.tenure_bypass_guard() TO tenure_admin`)
-- may bypass. Nobody else has any privilege on `guard_bypass`.
--
-- A row names one transaction id (txid_current() never repeats: it carries the
-- epoch), so a committed row opens nothing in any later transaction; rows of
-- finished transactions are deleted by the next call.
CREATE TABLE guard_bypass (
    txid bigint PRIMARY KEY
);
REVOKE ALL ON guard_bypass FROM PUBLIC;

CREATE FUNCTION tenure_bypass_guard() RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM guard_bypass
     WHERE txid < txid_snapshot_xmin(txid_current_snapshot());
    INSERT INTO guard_bypass (txid) VALUES (txid_current())
        ON CONFLICT (txid) DO NOTHING;
END;
$$;
REVOKE ALL ON FUNCTION tenure_bypass_guard() FROM PUBLIC;

-- The guard, as in 0002, with the bypass read from `guard_bypass` instead of
-- the `tenure.guard_bypass` setting (which now opens nothing).
CREATE OR REPLACE FUNCTION tenure_guard() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_job     text := current_setting('tenure.job_id', true);
    v_fence   text := current_setting('tenure.fence', true);
    v_current bigint;
    v_status  text;
    v_release boolean;
BEGIN
    IF EXISTS (SELECT 1 FROM guard_bypass WHERE txid = txid_current()) THEN
        RETURN NULL;
    END IF;

    IF v_job IS NULL OR v_job = '' OR v_fence IS NULL OR v_fence = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF001',
            MESSAGE = format('tenure guard: write to %I.%I outside a fenced transaction',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME),
            HINT = 'write through FencedTx::conn(), or use FenceStore::bypass_guard (a role granted EXECUTE on tenure_bypass_guard()) for migrations and operator fixes';
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
