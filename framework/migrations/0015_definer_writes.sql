-- Least privilege on the job rows: every change of a job's `status` or
-- `fence`, and every write to `schedules`, `leader_fences` and
-- `partition_fences`, goes through a SECURITY DEFINER function below that
-- enforces the protocol. The roles that run or enqueue jobs lose `UPDATE` on
-- those tables (`FenceStore::grant_worker`, `grant_producer`, `grant_operator`);
-- a producer inserts only `pending` rows with fence 0 (column grants, and the
-- insert wall below).
--
-- The guard no longer trusts the settings `tenure.job_id` / `tenure.fence`,
-- which any code can set: it admits a transaction only if `tenure_admit` (or a
-- claim with admission, or `tenure_admit_compensation`) recorded it in
-- `guard_admissions`, a table only those functions write. One row per backend
-- (keyed by `pg_backend_pid()`), overwritten by its next admission, valid only
-- for the transaction id it names: no row outlives its use, and no two
-- backends ever touch the same row (no lock contention between steps).
-- UNLOGGED: an admission never needs to survive a crash (its transaction
-- does not either).
--
-- The second wall is a BEFORE UPDATE trigger on `jobs` that refuses, whoever
-- the caller, a fence that goes down, and a terminal row that reopens (only
-- `tenure_redrive` moves `dead` back to `pending`, and only as the owner).

CREATE UNLOGGED TABLE guard_admissions (
    pid     integer PRIMARY KEY,
    txid    bigint  NOT NULL,
    job_id  uuid    NOT NULL,
    fence   bigint  NOT NULL
);
REVOKE ALL ON guard_admissions FROM PUBLIC;

-- Whether the current role is the owner of `relid` (or a member of its role,
-- or a superuser): inside a SECURITY DEFINER function of this schema it is.
CREATE FUNCTION tenure_is_owner(relid oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)
        OR pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = relid), 'MEMBER')
$$;

-- Records this transaction's admission for the guard. Also sets
-- `tenure.job_id` / `tenure.fence` for the transaction: informational only
-- (the application's own triggers and logs may read them; the guard does not
-- trust them, since any code can set them).
CREATE FUNCTION tenure_record_admission(p_id uuid, p_fence bigint) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO guard_admissions AS a (pid, txid, job_id, fence)
    VALUES (pg_backend_pid(), txid_current(), p_id, p_fence)
    ON CONFLICT (pid) DO UPDATE
        SET txid = EXCLUDED.txid, job_id = EXCLUDED.job_id, fence = EXCLUDED.fence;
    PERFORM set_config('tenure.job_id', p_id::text, true),
            set_config('tenure.fence', p_fence::text, true);
END
$$;
REVOKE ALL ON FUNCTION tenure_record_admission(uuid, bigint) FROM PUBLIC;

-- Whether this transaction was admitted for job `p_id` under `p_fence`.
CREATE FUNCTION tenure_admitted(p_id uuid, p_fence bigint) RETURNS boolean
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT EXISTS (SELECT 1 FROM guard_admissions
                    WHERE pid = pg_backend_pid() AND txid = txid_current()
                      AND job_id = p_id AND fence = p_fence)
$$;
REVOKE ALL ON FUNCTION tenure_admitted(uuid, bigint) FROM PUBLIC;

-- The claim (`FenceStore::claim`): raises the fence to `p_token`, strictly
-- (per-job locks) or to at least the row's own (`p_partitioned`: a partition
-- owner claims each of its jobs with one token), counts a takeover from a
-- generation that did not release. `p_admit`: also admits this transaction
-- (`claim_and_begin`: the first step runs in the claim's transaction).
CREATE FUNCTION tenure_claim(p_id uuid, p_token bigint, p_partitioned boolean, p_admit boolean)
RETURNS TABLE (job_type text, input jsonb, step integer, checkpoint jsonb, status text,
               takeovers integer, attempts integer, prev_fence bigint, took_over boolean,
               step_names text[], incompatible_ms bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE jobs j
       SET prev_fence = j.fence,
           took_over = (j.fence > 0 AND j.fence < p_token AND NOT j.released),
           takeovers = j.takeovers + (j.fence > 0 AND j.fence < p_token AND NOT j.released)::int,
           fence = p_token, released = false, status = 'running', updated_at = now()
     WHERE j.id = p_id AND j.status IN ('pending', 'running')
       AND (j.fence < p_token OR (p_partitioned AND j.fence = p_token))
    RETURNING j.job_type, j.input, j.step, j.checkpoint, j.status, j.takeovers, j.attempts,
              j.prev_fence, j.took_over, j.step_names,
              (extract(epoch FROM clock_timestamp() - j.incompatible_since) * 1000)::bigint
      INTO job_type, input, step, checkpoint, status, takeovers, attempts, prev_fence,
           took_over, step_names, incompatible_ms;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_admit THEN
        PERFORM tenure_record_admission(p_id, p_token);
    END IF;
    RETURN NEXT;
END
$$;
REVOKE ALL ON FUNCTION tenure_claim(uuid, bigint, boolean, boolean) FROM PUBLIC;

-- A step's admission (`FenceStore::begin_step`): the row is the generation
-- `p_fence` at step `p_step`, running and not released; locks it FOR UPDATE
-- (a concurrent claim waits for this transaction) and admits the transaction.
CREATE FUNCTION tenure_admit(p_id uuid, p_fence bigint, p_step integer) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM 1 FROM jobs
      WHERE id = p_id AND fence = p_fence AND step = p_step
        AND status = 'running' AND NOT released
      FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM tenure_record_admission(p_id, p_fence);
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION tenure_admit(uuid, bigint, integer) FROM PUBLIC;

-- The step CAS of 0003, now SECURITY DEFINER (the worker has no UPDATE on
-- `jobs`) and only inside a transaction admitted for this job and fence.
CREATE OR REPLACE FUNCTION tenure_step_cas(p_id uuid, p_fence bigint, p_step integer,
                                           p_out jsonb, p_last boolean)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT tenure_admitted(p_id, p_fence) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF002',
            MESSAGE = format('tenure: the commit of step %s of job %s under fence %s is outside its admitted transaction',
                             p_step, p_id, p_fence);
    END IF;
    UPDATE jobs
       SET step = step + 1, checkpoint = p_out,
           status = CASE WHEN p_last THEN 'done' ELSE status END,
           updated_at = now()
     WHERE id = p_id AND fence = p_fence AND step = p_step
       AND status = 'running' AND NOT released;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF002',
            MESSAGE = format('tenure: the commit of step %s of job %s under fence %s matched no row',
                             p_step, p_id, p_fence);
    END IF;
END
$$;
REVOKE ALL ON FUNCTION tenure_step_cas(uuid, bigint, integer, jsonb, boolean) FROM PUBLIC;

-- A failed attempt hands the job back (`FenceStore::fail`): attempts + 1.
CREATE FUNCTION tenure_fail(p_id uuid, p_fence bigint, p_error text) RETURNS SETOF integer
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET attempts = attempts + 1, last_error = p_error, released = true,
                    status = 'pending', updated_at = now()
     WHERE id = p_id AND fence = p_fence AND status = 'running' AND NOT released
    RETURNING attempts
$$;
REVOKE ALL ON FUNCTION tenure_fail(uuid, bigint, text) FROM PUBLIC;

-- A voluntary hand-back (`FenceStore::release`).
CREATE FUNCTION tenure_release(p_id uuid, p_fence bigint) RETURNS SETOF boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET released = true, status = 'pending', updated_at = now()
     WHERE id = p_id AND fence = p_fence AND status = 'running' AND NOT released
    RETURNING true
$$;
REVOKE ALL ON FUNCTION tenure_release(uuid, bigint) FROM PUBLIC;

-- A compatible claimer's step list (0012); clears the incompatibility mark.
CREATE FUNCTION tenure_record_steps(p_id uuid, p_fence bigint, p_names text[], p_fingerprint text)
RETURNS SETOF boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET step_names = p_names, steps_fingerprint = p_fingerprint,
                    incompatible_since = NULL
     WHERE id = p_id AND fence = p_fence AND status = 'running'
    RETURNING true
$$;
REVOKE ALL ON FUNCTION tenure_record_steps(uuid, bigint, text[], text) FROM PUBLIC;

-- Since when no compatible worker took the job (kept if set).
CREATE FUNCTION tenure_mark_incompatible(p_id uuid, p_fence bigint) RETURNS SETOF boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET incompatible_since = coalesce(incompatible_since, clock_timestamp())
     WHERE id = p_id AND fence = p_fence AND status = 'running'
    RETURNING true
$$;
REVOKE ALL ON FUNCTION tenure_mark_incompatible(uuid, bigint) FROM PUBLIC;

-- The job dies under its fence (`p_hook`: its type has an `on_dead` hook, so
-- its compensation is pending from this statement on).
CREATE FUNCTION tenure_mark_dead(p_id uuid, p_fence bigint, p_error text, p_hook boolean)
RETURNS SETOF boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET status = 'dead', last_error = p_error, released = true, updated_at = now(),
                    compensation = CASE WHEN p_hook THEN 'pending' ELSE 'none' END
     WHERE id = p_id AND fence = p_fence AND status IN ('pending', 'running')
    RETURNING true
$$;
REVOKE ALL ON FUNCTION tenure_mark_dead(uuid, bigint, text, boolean) FROM PUBLIC;

-- A message past its MaxDeliver, with no fence to name (the runtime's
-- dead-marking of a given-up delivery).
CREATE FUNCTION tenure_mark_dead_unfenced(p_id uuid, p_error text, p_hook boolean)
RETURNS SETOF boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET status = 'dead', last_error = p_error, released = true, updated_at = now(),
                    compensation = CASE WHEN p_hook THEN 'pending' ELSE 'none' END
     WHERE id = p_id AND status IN ('pending', 'running')
    RETURNING true
$$;
REVOKE ALL ON FUNCTION tenure_mark_dead_unfenced(uuid, text, boolean) FROM PUBLIC;

-- An operator's redrive of a dead job (the fence it saw, `p_fence`, must
-- still be the row's). The only way a terminal row reopens.
CREATE FUNCTION tenure_redrive(p_id uuid, p_fence bigint) RETURNS SETOF boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET status = 'pending', takeovers = 0, attempts = 0, released = true,
                    incompatible_since = NULL, compensation = 'none', updated_at = now()
     WHERE id = p_id AND status = 'dead' AND fence = p_fence
    RETURNING true
$$;
REVOKE ALL ON FUNCTION tenure_redrive(uuid, bigint) FROM PUBLIC;

-- An operator's cancel (0007): no token; the row lock orders it after any
-- open step transaction. Refused while a compensation is pending.
CREATE FUNCTION tenure_cancel(p_id uuid, p_reason text) RETURNS SETOF bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET status = 'cancelled', cancel_reason = p_reason, cancelled_at = now(),
                    awaiting_publish = false, updated_at = now()
     WHERE id = p_id AND status IN ('pending', 'running', 'dead')
       AND compensation <> 'pending'
    RETURNING fence
$$;
REVOKE ALL ON FUNCTION tenure_cancel(uuid, text) FROM PUBLIC;

-- Compensation (0011): the compensating worker raises the dead row's fence
-- to its token (or finds it there), ...
CREATE FUNCTION tenure_claim_compensation(p_id uuid, p_token bigint)
RETURNS TABLE (input jsonb, step integer, checkpoint jsonb, last_error text, step_names text[])
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs j SET fence = p_token, updated_at = now()
     WHERE j.id = p_id AND j.status = 'dead' AND j.compensation = 'pending' AND j.fence <= p_token
    RETURNING j.input, j.step, j.checkpoint, j.last_error, j.step_names
$$;
REVOKE ALL ON FUNCTION tenure_claim_compensation(uuid, bigint) FROM PUBLIC;

-- ... opens the hook's admitted transaction, ...
CREATE FUNCTION tenure_admit_compensation(p_id uuid, p_fence bigint) RETURNS SETOF integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_step integer;
BEGIN
    SELECT j.step INTO v_step FROM jobs j
     WHERE j.id = p_id AND j.fence = p_fence AND j.status = 'dead' AND j.compensation = 'pending'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM tenure_record_admission(p_id, p_fence);
    RETURN NEXT v_step;
END
$$;
REVOKE ALL ON FUNCTION tenure_admit_compensation(uuid, bigint) FROM PUBLIC;

-- ... and marks it done in that transaction.
CREATE FUNCTION tenure_finish_compensation(p_id uuid, p_fence bigint) RETURNS SETOF boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET compensation = 'done', updated_at = now()
     WHERE id = p_id AND fence = p_fence AND status = 'dead' AND compensation = 'pending'
    RETURNING true
$$;
REVOKE ALL ON FUNCTION tenure_finish_compensation(uuid, bigint) FROM PUBLIC;

-- A producer whose publish failed hands never-claimed pending rows to the
-- scheduler leader's publisher (`FenceStore::hand_to_publisher`).
CREATE FUNCTION tenure_hand_to_publisher(p_ids uuid[]) RETURNS SETOF uuid
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    UPDATE jobs SET awaiting_publish = true, run_at = coalesce(run_at, now()), updated_at = now()
     WHERE id = ANY(p_ids) AND status = 'pending' AND fence = 0 AND NOT awaiting_publish
    RETURNING id
$$;
REVOKE ALL ON FUNCTION tenure_hand_to_publisher(uuid[]) FROM PUBLIC;

-- An elected role's claim: raises its fence strictly (0008).
CREATE FUNCTION tenure_claim_leader(p_role text, p_token bigint, p_worker text) RETURNS SETOF boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    INSERT INTO leader_fences AS l (role, fence, worker) VALUES (p_role, p_token, p_worker)
    ON CONFLICT (role) DO UPDATE
        SET fence = EXCLUDED.fence, worker = EXCLUDED.worker, since = clock_timestamp()
      WHERE l.fence < EXCLUDED.fence
    RETURNING true
$$;
REVOKE ALL ON FUNCTION tenure_claim_leader(text, bigint, text) FROM PUBLIC;

-- Whether `p_role` is still held under `p_token`; locks its fence row FOR
-- UPDATE for this transaction, so a successor's claim waits for the write.
-- Every leader write checks it itself (a caller may skip the admission below).
CREATE FUNCTION tenure_leader_holds(p_role text, p_token bigint) RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT EXISTS (SELECT 1 FROM leader_fences WHERE role = p_role AND fence = p_token FOR UPDATE)
$$;
REVOKE ALL ON FUNCTION tenure_leader_holds(text, bigint) FROM PUBLIC;

-- A leader's write opens with this in its transaction (`begin_leader`): one
-- row when the role is still held under `p_token`, none otherwise.
CREATE FUNCTION tenure_admit_leader(p_role text, p_token bigint) RETURNS SETOF boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT true WHERE tenure_leader_holds(p_role, p_token)
$$;
REVOKE ALL ON FUNCTION tenure_admit_leader(text, bigint) FROM PUBLIC;

-- The leader marks published delayed jobs (its fence checked here).
CREATE FUNCTION tenure_mark_published(p_role text, p_token bigint, p_ids uuid[]) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_done bigint;
BEGIN
    IF NOT tenure_leader_holds(p_role, p_token) THEN
        RAISE EXCEPTION USING ERRCODE = 'TF005',
            MESSAGE = format('tenure: role %s is no longer held under fence %s', p_role, p_token);
    END IF;
    UPDATE jobs SET awaiting_publish = false, updated_at = now()
     WHERE id = ANY(p_ids) AND awaiting_publish;
    GET DIAGNOSTICS v_done = ROW_COUNT;
    RETURN v_done;
END
$$;
REVOKE ALL ON FUNCTION tenure_mark_published(text, bigint, uuid[]) FROM PUBLIC;

-- A worker registers the schedules it was built with (0008).
CREATE FUNCTION tenure_define_schedule(p_name text, p_job_type text, p_expr text,
                                       p_time_zone text, p_missed text, p_input jsonb)
RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    INSERT INTO schedules (name, job_type, expr, time_zone, missed, input)
    VALUES (p_name, p_job_type, p_expr, p_time_zone, p_missed, p_input)
    ON CONFLICT (name) DO UPDATE SET job_type = EXCLUDED.job_type,
        expr = EXCLUDED.expr, time_zone = EXCLUDED.time_zone,
        missed = EXCLUDED.missed, input = EXCLUDED.input, updated_at = clock_timestamp()
$$;
REVOKE ALL ON FUNCTION tenure_define_schedule(text, text, text, text, text, jsonb) FROM PUBLIC;

-- The scheduler leader advances a schedule (never backwards), under its fence.
CREATE FUNCTION tenure_advance_schedule(p_role text, p_token bigint, p_name text,
                                        p_last timestamptz, p_next timestamptz,
                                        p_enqueued bigint, p_skipped bigint)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT tenure_leader_holds(p_role, p_token) THEN
        RAISE EXCEPTION USING ERRCODE = 'TF005',
            MESSAGE = format('tenure: role %s is no longer held under fence %s', p_role, p_token);
    END IF;
    IF p_enqueued < 0 OR p_skipped < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'tenure: a schedule''s counters only grow';
    END IF;
    UPDATE schedules SET last_tick = greatest(last_tick, p_last), next_tick = p_next,
           enqueued = enqueued + p_enqueued, skipped = skipped + p_skipped,
           updated_at = clock_timestamp()
     WHERE name = p_name;
END
$$;
REVOKE ALL ON FUNCTION tenure_advance_schedule(text, bigint, text, timestamptz, timestamptz, bigint, bigint) FROM PUBLIC;

-- A partition owner's claim: raises the partition's fence strictly (0013).
CREATE FUNCTION tenure_claim_partition(p_job_type text, p_partition integer, p_token bigint,
                                       p_worker text)
RETURNS SETOF bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    INSERT INTO partition_fences AS f (job_type, partition, fence, worker)
    VALUES (p_job_type, p_partition, p_token, p_worker)
    ON CONFLICT (job_type, partition) DO UPDATE
        SET fence = EXCLUDED.fence, worker = EXCLUDED.worker, since = clock_timestamp()
      WHERE f.fence < EXCLUDED.fence
    RETURNING fence
$$;
REVOKE ALL ON FUNCTION tenure_claim_partition(text, integer, bigint, text) FROM PUBLIC;

-- The guard of 0011, admitting a transaction only by its row in
-- `guard_admissions` (the settings `tenure.job_id` / `tenure.fence` open
-- nothing any more).
CREATE OR REPLACE FUNCTION tenure_guard() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_job     uuid;
    v_fence   bigint;
    v_current bigint;
    v_status  text;
    v_release boolean;
    v_comp    text;
BEGIN
    IF EXISTS (SELECT 1 FROM guard_bypass WHERE txid = txid_current()) THEN
        RETURN NULL;
    END IF;

    SELECT a.job_id, a.fence INTO v_job, v_fence
      FROM guard_admissions a
     WHERE a.pid = pg_backend_pid() AND a.txid = txid_current();

    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF001',
            MESSAGE = format('tenure guard: write to %I.%I outside an admitted transaction',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME),
            HINT = 'write through FencedTx::conn() (admitted by tenure_admit or a claim), or use FenceStore::bypass_guard (a role granted EXECUTE on tenure_bypass_guard()) for migrations and operator fixes';
    END IF;

    SELECT j.fence, j.status, j.released, j.compensation
      INTO v_current, v_status, v_release, v_comp
      FROM jobs j
     WHERE j.id = v_job
       FOR SHARE;

    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF001',
            MESSAGE = format('tenure guard: write to %I.%I refused: job %s does not exist',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME, v_job);
    END IF;

    IF v_current <> v_fence
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

-- The walls on `jobs` itself, whoever holds a privilege on it.
CREATE FUNCTION tenure_jobs_insert_wall() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF (NEW.status <> 'pending' OR NEW.fence <> 0 OR NEW.step <> 0 OR NEW.released
        OR NEW.compensation <> 'none')
       AND NOT tenure_is_owner(TG_RELID) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF004',
            MESSAGE = format('tenure: job %s refused: a new job is pending with fence 0 (got status %s, fence %s, step %s)',
                             NEW.id, NEW.status, NEW.fence, NEW.step);
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION tenure_jobs_update_wall() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.fence < OLD.fence THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF004',
            MESSAGE = format('tenure: job %s refused: a fence only rises (from %s to %s)',
                             OLD.id, OLD.fence, NEW.fence);
    END IF;
    IF OLD.status IN ('done', 'cancelled') AND NEW.status <> OLD.status THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF004',
            MESSAGE = format('tenure: job %s refused: a %s job never reopens (to %s)',
                             OLD.id, OLD.status, NEW.status);
    END IF;
    IF OLD.status = 'dead' AND NEW.status NOT IN ('dead', 'cancelled')
       AND NOT tenure_is_owner(TG_RELID) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF004',
            MESSAGE = format('tenure: job %s refused: a dead job reopens only by an operator''s redrive (tenure_redrive)',
                             OLD.id);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_insert_wall BEFORE INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION tenure_jobs_insert_wall();
CREATE TRIGGER jobs_update_wall BEFORE UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION tenure_jobs_update_wall();

-- Upgrades: roles granted before this migration (`grant_worker` gave
-- `SELECT, INSERT, UPDATE` on these tables) lose every direct write the
-- functions above replace: `UPDATE` on all four, `INSERT` on the three fence
-- and schedule tables (an inserted fence row would hold a role or partition
-- forever). `INSERT` on `jobs` stays (the insert wall checks it); re-run
-- `grant_worker` / `grant_producer` for the column grants.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.relname, a.privilege_type,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                    ELSE quote_ident(a.grantee::regrole::text) END AS grantee
          FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.relnamespace = current_schema()::regnamespace
           AND a.grantee <> c.relowner
           AND ((c.relname IN ('jobs', 'schedules', 'leader_fences', 'partition_fences')
                 AND a.privilege_type = 'UPDATE')
                OR (c.relname IN ('schedules', 'leader_fences', 'partition_fences')
                    AND a.privilege_type = 'INSERT'))
    LOOP
        EXECUTE format('REVOKE %s ON %I FROM %s', r.privilege_type, r.relname, r.grantee);
    END LOOP;
END
$$;
