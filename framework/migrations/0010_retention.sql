-- Retention of finished jobs (issue 19): the elected scheduler leader (in its
-- fenced transaction) and an operator (`tenure prune`) delete finished rows
-- older than an age, a batch at a time, with their history events.
--
-- SECURITY DEFINER: a worker role has no DELETE on `jobs` nor any privilege
-- on `job_events`; it may only call this. Rows are chosen through
-- `jobs_status_created_idx` (`created_at <= updated_at`, so the cutoff bounds
-- the index scan) rather than a new index on `updated_at`, which would cost
-- every step commit its HOT update. `FOR UPDATE SKIP LOCKED`: a row someone
-- holds is left for the next batch, and nobody waits on the pruner.
CREATE FUNCTION tenure_prune_jobs(p_status text, p_older_than_secs double precision,
                                  p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    cutoff timestamptz := clock_timestamp() - make_interval(secs => p_older_than_secs);
    n bigint;
BEGIN
    IF p_status NOT IN ('done', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'tenure_prune_jobs: % is not a finished status', p_status
            USING ERRCODE = '22023';
    END IF;
    WITH chosen AS (
        SELECT id FROM jobs
         WHERE status = p_status AND created_at < cutoff AND updated_at < cutoff
         ORDER BY status, created_at, id
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs j USING chosen WHERE j.id = chosen.id RETURNING j.id
    ), events AS (
        DELETE FROM job_events e USING gone WHERE e.job_id = gone.id
    )
    SELECT count(*) INTO n FROM gone;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION tenure_prune_jobs(text, double precision, integer) FROM PUBLIC;
