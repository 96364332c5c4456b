-- What each worker says of itself, for operators (the workers page): its
-- session lease, the lease's health, its jobs in flight. Written by the worker
-- through `tenure_report_worker` on every health change and every half TTL,
-- and once more as `stopped` at a graceful shutdown. One row per worker id,
-- overwritten. Nothing reads it to decide anything: the fence never depends on
-- a worker's word about itself.
CREATE TABLE worker_reports (
    worker        text        PRIMARY KEY,
    lease_id      bigint,
    -- healthy, degraded, lost (the session's health) or stopped
    health        text        NOT NULL,
    in_flight     integer     NOT NULL,
    max_in_flight integer     NOT NULL,
    lease_ttl_ms  integer     NOT NULL,
    started_at    timestamptz NOT NULL,
    reported_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION tenure_report_worker(p_worker text, p_lease bigint, p_health text,
                                     p_in_flight integer, p_max integer,
                                     p_ttl_ms integer, p_started timestamptz)
RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    INSERT INTO worker_reports AS r
           (worker, lease_id, health, in_flight, max_in_flight, lease_ttl_ms, started_at)
    VALUES (p_worker, p_lease, p_health, p_in_flight, p_max, p_ttl_ms, p_started)
    ON CONFLICT (worker) DO UPDATE
       SET lease_id = EXCLUDED.lease_id, health = EXCLUDED.health,
           in_flight = EXCLUDED.in_flight, max_in_flight = EXCLUDED.max_in_flight,
           lease_ttl_ms = EXCLUDED.lease_ttl_ms, started_at = EXCLUDED.started_at,
           reported_at = clock_timestamp();
$$;
REVOKE ALL ON FUNCTION tenure_report_worker(text, bigint, text, integer, integer, integer, timestamptz) FROM PUBLIC;
