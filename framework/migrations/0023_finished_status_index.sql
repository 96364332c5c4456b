-- The status index holds finished rows only (issue 33.6). With all five
-- statuses in it, a table whose statistics saw no live row (a million
-- finished jobs and a quiet moment at the last ANALYZE) estimates
-- `status = 'running'` at one row, as selective as the primary key, and
-- the generic plans of the admission and the step CAS (`WHERE id = p_id ...
-- AND status = 'running'`) took this index and filtered every `running`
-- entry for the one id (measured with auto_explain: 77 more buffer hits per
-- job with a million finished rows; throughput 0.76-0.96 of an empty
-- table). What it serves is finished rows: retention's prune and lists of
-- finished jobs. A lookup of a live job by id can only take the primary
-- key now, and a claim writes no entry into it.
DROP INDEX jobs_status_created_idx;
CREATE INDEX jobs_finished_created_idx ON jobs (status, created_at, id)
    WHERE status IN ('done', 'dead', 'cancelled');

-- As in 0016, with the partial index's predicate spelled out, so a generic
-- plan (`status = p_status`, unknown) can still use it.
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
         WHERE status IN ('done', 'dead', 'cancelled')
           AND status = p_status AND created_at < cutoff AND updated_at < cutoff
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
