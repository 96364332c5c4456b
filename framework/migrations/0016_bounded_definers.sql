-- Bounded definer functions (issue 31, item 6). The worker role may execute
-- these SECURITY DEFINER functions, which write with the schema owner's
-- rights; until now they trusted their arguments, so any code on the worker
-- role could delete every finished job with its history and tombstone (a
-- negative age, any batch), overwrite other workers' reports, and write
-- made-up refusals into any job's history. Each now refuses what its caller
-- may not ask, with SQLSTATE TF020 (bad arguments) or 42501 (another role's
-- row), and writes nothing then.

-- The operator's floor under the ages a prune may be given: one row, written
-- only by the schema's owner (no role is granted anything on it). The
-- defaults are the smallest ages `Retention::validate` accepts (1 s); raise
-- them to the smallest retention the namespace uses, e.g.
-- `UPDATE tenure.prune_floor SET job_age_secs = 86400, key_age_secs = 604800`,
-- and no worker can prune younger rows or tombstones.
CREATE TABLE prune_floor (
    only_row     boolean          PRIMARY KEY DEFAULT true CHECK (only_row),
    job_age_secs double precision NOT NULL DEFAULT 1 CHECK (job_age_secs >= 1),
    key_age_secs double precision NOT NULL DEFAULT 1 CHECK (key_age_secs >= 1)
);
INSERT INTO prune_floor DEFAULT VALUES;

-- Refuses an age below `floor` (or not a number, or beyond ~100 years,
-- which make_interval cannot hold) and a batch outside 1..10000
-- (`MAX_PRUNE_BATCH`).
CREATE FUNCTION tenure_check_prune(p_fn text, p_age double precision, p_floor double precision,
                                   p_limit integer)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_age IS NULL OR NOT (p_age BETWEEN p_floor AND 3.2e9) THEN
        RAISE EXCEPTION '%: age % s is below the prune floor % s (prune_floor, set by the schema owner)',
            p_fn, p_age, p_floor USING ERRCODE = 'TF020';
    END IF;
    IF p_limit IS NULL OR NOT (p_limit BETWEEN 1 AND 10000) THEN
        RAISE EXCEPTION '%: batch % is not between 1 and 10000', p_fn, p_limit
            USING ERRCODE = 'TF020';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION tenure_check_prune(text, double precision, double precision, integer) FROM PUBLIC;

-- As in 0014, with the bounds checked first.
CREATE OR REPLACE FUNCTION tenure_prune_jobs(p_status text, p_older_than_secs double precision,
                                             p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    cutoff timestamptz;
    n bigint;
BEGIN
    PERFORM tenure_check_prune('tenure_prune_jobs', p_older_than_secs,
                               (SELECT job_age_secs FROM prune_floor), p_limit);
    IF p_status IS NULL OR p_status NOT IN ('done', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'tenure_prune_jobs: % is not a finished status', p_status
            USING ERRCODE = '22023';
    END IF;
    cutoff := clock_timestamp() - make_interval(secs => p_older_than_secs);
    WITH chosen AS (
        SELECT id FROM jobs
         WHERE status = p_status AND created_at < cutoff AND updated_at < cutoff
           AND compensation <> 'pending'
         ORDER BY status, created_at, id
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs j USING chosen WHERE j.id = chosen.id
        RETURNING j.id, j.job_type, j.input, j.status, j.updated_at
    ), kept AS (
        INSERT INTO job_tombstones (id, job_type, input_md5, status, finished_at)
        SELECT id, job_type, md5(input::text), status, updated_at FROM gone
        ON CONFLICT (id) DO NOTHING
    ), events AS (
        DELETE FROM job_events e USING gone WHERE e.job_id = gone.id
    )
    SELECT count(*) INTO n FROM gone;
    RETURN n;
END
$$;

-- As in 0014, with the bounds checked first: a tombstone pruned early
-- reopens its key, and the job runs again.
CREATE OR REPLACE FUNCTION tenure_prune_tombstones(p_older_than_secs double precision,
                                                   p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM tenure_check_prune('tenure_prune_tombstones', p_older_than_secs,
                               (SELECT key_age_secs FROM prune_floor), p_limit);
    WITH chosen AS (
        SELECT id FROM job_tombstones
         WHERE finished_at < clock_timestamp() - make_interval(secs => p_older_than_secs)
         ORDER BY finished_at
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM job_tombstones t USING chosen WHERE t.id = chosen.id RETURNING t.id
    )
    SELECT count(*) INTO n FROM gone;
    RETURN n;
END
$$;

-- A worker's report row remembers the login role (`session_user`) that
-- wrote it; another role cannot overwrite it. Rows from before this
-- migration have none: the next report claims them. Workers that must not
-- overwrite each other's reports log in as different roles.
ALTER TABLE worker_reports ADD COLUMN reported_by name;

CREATE OR REPLACE FUNCTION tenure_report_worker(p_worker text, p_lease bigint, p_health text,
                                                p_in_flight integer, p_max integer,
                                                p_ttl_ms integer, p_started timestamptz,
                                                p_job_types text[])
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    written bigint;
BEGIN
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 255
       OR p_health IS NULL OR p_health NOT IN ('healthy', 'degraded', 'lost', 'stopped')
       OR p_in_flight IS NULL OR p_in_flight < 0
       OR p_max IS NULL OR p_max < 1
       OR p_ttl_ms IS NULL OR p_ttl_ms < 1000
       OR p_started IS NULL
       OR p_job_types IS NULL OR coalesce(cardinality(p_job_types), 0) > 1000
       OR EXISTS (SELECT 1 FROM unnest(p_job_types) t WHERE t IS NULL OR length(t) NOT BETWEEN 1 AND 128)
    THEN
        RAISE EXCEPTION 'tenure_report_worker: not a report a worker can make (worker %, health %)',
            left(p_worker, 255), p_health USING ERRCODE = 'TF020';
    END IF;
    INSERT INTO worker_reports AS r
           (worker, lease_id, health, in_flight, max_in_flight, lease_ttl_ms, started_at,
            job_types, reported_by)
    VALUES (p_worker, p_lease, p_health, p_in_flight, p_max, p_ttl_ms, p_started, p_job_types,
            session_user)
    ON CONFLICT (worker) DO UPDATE
       SET lease_id = EXCLUDED.lease_id, health = EXCLUDED.health,
           in_flight = EXCLUDED.in_flight, max_in_flight = EXCLUDED.max_in_flight,
           lease_ttl_ms = EXCLUDED.lease_ttl_ms, started_at = EXCLUDED.started_at,
           job_types = EXCLUDED.job_types, reported_by = EXCLUDED.reported_by,
           reported_at = clock_timestamp()
     WHERE r.reported_by IS NULL OR r.reported_by = EXCLUDED.reported_by;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF written = 0 THEN
        RAISE EXCEPTION 'tenure_report_worker: worker % is reported by another role', p_worker
            USING ERRCODE = '42501';
    END IF;
END
$$;

-- A refused stale write, recorded only as a fence can have refused it: the
-- job exists, the refused token is below its fence (a fence refuses only a
-- smaller token), the winner is above the refused token and at most the
-- fence, the step at most the job's (a stale owner never got further than
-- the row), `where` is the fence's `step` or `claim`, and the writer
-- (`application_name`) is no worker another role reports as. The same
-- refusal (job, token, step, where) is recorded once.
CREATE OR REPLACE FUNCTION tenure_record_refusal(p_id uuid, p_token bigint, p_current bigint,
                                                 p_step integer, p_where text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    who text := nullif(current_setting('application_name', true), '');
    j record;
BEGIN
    SELECT fence, step INTO j FROM jobs WHERE id = p_id;
    IF NOT FOUND
       OR p_token IS NULL OR p_token < 1 OR p_token >= j.fence
       OR (p_current IS NOT NULL AND (p_current <= p_token OR p_current > j.fence))
       OR (p_step IS NOT NULL AND (p_step < 0 OR p_step > j.step))
       OR p_where IS NULL OR p_where NOT IN ('step', 'claim')
    THEN
        RAISE EXCEPTION 'tenure_record_refusal: not a refusal the fence of job % can have made', p_id
            USING ERRCODE = 'TF020';
    END IF;
    IF EXISTS (SELECT 1 FROM worker_reports
                WHERE worker = who AND reported_by IS NOT NULL AND reported_by <> session_user) THEN
        RAISE EXCEPTION 'tenure_record_refusal: worker % is reported by another role', who
            USING ERRCODE = '42501';
    END IF;
    IF EXISTS (SELECT 1 FROM job_events
                WHERE job_id = p_id AND kind = 'stale_refused' AND token = p_token
                  AND step IS NOT DISTINCT FROM p_step AND detail = to_jsonb(p_where)) THEN
        RETURN;
    END IF;
    INSERT INTO job_events (job_id, kind, token, other_token, step, worker, detail)
    VALUES (p_id, 'stale_refused', p_token, p_current, p_step, who, to_jsonb(p_where));
END
$$;
