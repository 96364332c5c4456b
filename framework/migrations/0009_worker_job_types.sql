-- Routing by job type: each worker receives only the job types it registered,
-- so a job of a type no running worker registers waits. Workers report their
-- types, so that operators (`tenure jobs`, the web view) and the
-- `tenure.jobs.unrouted` metric can say which waiting jobs have no worker.
ALTER TABLE worker_reports ADD COLUMN job_types text[] NOT NULL DEFAULT '{}';

DROP FUNCTION tenure_report_worker(text, bigint, text, integer, integer, integer, timestamptz);

CREATE FUNCTION tenure_report_worker(p_worker text, p_lease bigint, p_health text,
                                     p_in_flight integer, p_max integer,
                                     p_ttl_ms integer, p_started timestamptz,
                                     p_job_types text[])
RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    INSERT INTO worker_reports AS r
           (worker, lease_id, health, in_flight, max_in_flight, lease_ttl_ms, started_at,
            job_types)
    VALUES (p_worker, p_lease, p_health, p_in_flight, p_max, p_ttl_ms, p_started, p_job_types)
    ON CONFLICT (worker) DO UPDATE
       SET lease_id = EXCLUDED.lease_id, health = EXCLUDED.health,
           in_flight = EXCLUDED.in_flight, max_in_flight = EXCLUDED.max_in_flight,
           lease_ttl_ms = EXCLUDED.lease_ttl_ms, started_at = EXCLUDED.started_at,
           job_types = EXCLUDED.job_types, reported_at = clock_timestamp();
$$;
REVOKE ALL ON FUNCTION tenure_report_worker(text, bigint, text, integer, integer, integer, timestamptz, text[]) FROM PUBLIC;
