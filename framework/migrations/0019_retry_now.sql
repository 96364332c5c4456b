-- Retry now and reschedule (issue 35, item 6): an operator starts a job that
-- waits in retry backoff now, or moves a delayed job's `run_at`. Neither
-- gives a job an owner: a retry-now only checks the row under its lock and
-- records the event, then the client publishes one more message for the job,
-- which goes through the normal admission, lock and claim (a running owner's
-- lock and fence keep it out; the original message, when its backoff ends, is
-- absorbed the same way). A reschedule changes `run_at` only while the job
-- still awaits publication: the leader's publisher locks the due rows it
-- publishes until it has marked them published (`tenure_lock_due`), so a
-- reschedule either comes first (and the publisher sees the new `run_at`) or
-- finds the job published and changes nothing. Both are the operator's grant.

-- Retry-now's check, under the row lock: 'ok' (and the event `retried_now`)
-- for a pending job that failed at least once and whose message is out;
-- otherwise what it is instead: 'unknown', its status ('running', 'done',
-- 'dead', 'cancelled'), 'delayed' (awaiting publication) or 'not_failed'.
-- `o_attempts`: the row's attempts (the new message's id carries it, so a
-- repeated retry-now of the same wait publishes one message).
CREATE FUNCTION tenure_retry_now(p_id uuid)
RETURNS TABLE (o_outcome text, o_attempts integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    r jobs%ROWTYPE;
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION 'tenure_retry_now: no job id' USING ERRCODE = 'TF020';
    END IF;
    SELECT * INTO r FROM jobs WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown'::text, 0;
        RETURN;
    END IF;
    IF r.status <> 'pending' THEN
        RETURN QUERY SELECT r.status, r.attempts;
    ELSIF r.awaiting_publish THEN
        RETURN QUERY SELECT 'delayed'::text, r.attempts;
    ELSIF r.attempts = 0 THEN
        RETURN QUERY SELECT 'not_failed'::text, r.attempts;
    ELSE
        INSERT INTO job_events (job_id, kind, token, step, worker, attempts, takeovers)
        VALUES (p_id, 'retried_now', r.fence, r.step,
                nullif(current_setting('application_name', true), ''), r.attempts, r.takeovers);
        RETURN QUERY SELECT 'ok'::text, r.attempts;
    END IF;
END
$$;

-- Moves a delayed job's `run_at` under the row lock, only while it awaits
-- publication: 'ok' (and the event `rescheduled`, detail {from, to}), else
-- 'unknown', its status, or 'published' (its message is out). TF020 for a
-- time that is not one (NULL, infinite, beyond the year 9999).
CREATE FUNCTION tenure_reschedule(p_id uuid, p_run_at timestamptz)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    r jobs%ROWTYPE;
BEGIN
    IF p_id IS NULL OR p_run_at IS NULL OR NOT isfinite(p_run_at)
       OR p_run_at >= '10000-01-01'::timestamptz THEN
        RAISE EXCEPTION 'tenure_reschedule: % is not a time to run job %', p_run_at, p_id
            USING ERRCODE = 'TF020';
    END IF;
    SELECT * INTO r FROM jobs WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    IF r.status <> 'pending' THEN
        RETURN r.status;
    END IF;
    IF NOT r.awaiting_publish THEN
        RETURN 'published';
    END IF;
    UPDATE jobs SET run_at = p_run_at, updated_at = now() WHERE id = p_id;
    INSERT INTO job_events (job_id, kind, token, step, worker, detail)
    VALUES (p_id, 'rescheduled', r.fence, r.step,
            nullif(current_setting('application_name', true), ''),
            jsonb_build_object('from', r.run_at, 'to', p_run_at));
    RETURN 'ok';
END
$$;

-- The leader's publisher: up to `p_limit` due rows, locked until its
-- transaction (which publishes them, then marks them with
-- `tenure_mark_published`) ends; rows another transaction holds (a
-- reschedule, a cancel) are skipped this round. The worker may not lock
-- `jobs` rows itself (no UPDATE privilege), hence a definer function.
CREATE FUNCTION tenure_lock_due(p_limit integer)
RETURNS TABLE (id uuid, job_type text, input jsonb, run_at timestamptz, trace_context jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_limit IS NULL OR NOT (p_limit BETWEEN 1 AND 10000) THEN
        RAISE EXCEPTION 'tenure_lock_due: batch % is not between 1 and 10000', p_limit
            USING ERRCODE = 'TF020';
    END IF;
    RETURN QUERY
        SELECT j.id, j.job_type, j.input, j.run_at, j.trace_context
          FROM jobs j
         WHERE j.awaiting_publish AND j.run_at <= now()
         ORDER BY j.run_at, j.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED;
END
$$;

REVOKE ALL ON FUNCTION tenure_retry_now(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION tenure_reschedule(uuid, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION tenure_lock_due(integer) FROM PUBLIC;
