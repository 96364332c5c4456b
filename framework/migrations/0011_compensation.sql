-- Failure hooks (`#[tenure::job(on_dead = ..)]`, issue 19): a dead job's
-- compensation runs exactly once per death.
--
-- `compensation` is `none` (nothing to run: the job is not dead, or its type
-- has no hook), `pending` (the job died and its hook has not committed; set
-- in the same statement that marks the row dead), or `done` (the hook's
-- transaction committed, flipping `pending` to `done` under the fence).
-- A redrive sets it back to `none`; the next death sets it `pending` again.
ALTER TABLE jobs ADD COLUMN compensation text NOT NULL DEFAULT 'none'
    CHECK (compensation IN ('none', 'pending', 'done'));

-- The guard of 0004, which also admits the writes of a compensation: a
-- transaction whose `tenure.fence` is the job's current fence while the job
-- is `dead` with its compensation `pending` (`FenceStore::begin_compensation`
-- raised the fence to the compensating worker's token first, so a stale
-- owner of the same job is refused as before).
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
    v_comp    text;
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

    SELECT j.fence, j.status, j.released, j.compensation
      INTO v_current, v_status, v_release, v_comp
      FROM jobs j
     WHERE j.id = v_job::uuid
       FOR SHARE;

    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF001',
            MESSAGE = format('tenure guard: write to %I.%I refused: job %s does not exist',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME, v_job);
    END IF;

    IF v_current <> v_fence::numeric
       OR NOT ((v_status = 'running' AND NOT v_release)
               OR (v_status = 'dead' AND v_comp = 'pending')) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF001',
            MESSAGE = format('tenure guard: write to %I.%I refused: job %s fence %s is not the current generation (fence %s, status %s, released %s)',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME, v_job, v_fence, v_current, v_status, v_release),
            DETAIL = format('job_id=%s ours=%s current=%s', v_job, v_fence, v_current);
    END IF;

    RETURN NULL;
END;
$$;
