-- The limits each worker runs its job types with (issue 35: every control
-- visible to an operator): `max_in_flight`, the fleet-wide `fleet_max`, the
-- per-worker `rate`, as the worker reports them with its report, by type
-- (only types with some limit). For the workers page and `tenure workers`
-- only: nothing decides on them (the fleet limit is kept in etcd).
ALTER TABLE worker_reports ADD COLUMN type_limits jsonb NOT NULL DEFAULT '{}';

-- The report with the limits: the same checks and the same "only the role
-- that wrote a worker's row may overwrite it" as the report of 0016, which
-- it calls, then the limits (an object of at most 64 kB; TF020 otherwise).
CREATE FUNCTION tenure_report_worker(p_worker text, p_lease bigint, p_health text,
                                     p_in_flight integer, p_max integer,
                                     p_ttl_ms integer, p_started timestamptz,
                                     p_job_types text[], p_type_limits jsonb)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_type_limits IS NULL OR jsonb_typeof(p_type_limits) <> 'object'
       OR pg_column_size(p_type_limits) > 65536 THEN
        RAISE EXCEPTION 'tenure_report_worker: not a report a worker can make (worker %, limits)',
            left(p_worker, 255) USING ERRCODE = 'TF020';
    END IF;
    PERFORM tenure_report_worker(p_worker, p_lease, p_health, p_in_flight, p_max, p_ttl_ms,
                                 p_started, p_job_types);
    UPDATE worker_reports SET type_limits = p_type_limits WHERE worker = p_worker;
END
$$;

REVOKE ALL ON FUNCTION
    tenure_report_worker(text, bigint, text, integer, integer, integer, timestamptz, text[], jsonb)
    FROM PUBLIC;

-- Upgrade: whoever may make the report of 0016 (`grant_worker`, which now
-- names this one) may make this one, so workers keep reporting without a
-- new grant run.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT quote_ident(a.grantee::regrole::text) AS grantee
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = 'tenure_report_worker(text, bigint, text, integer, integer, integer, timestamptz, text[])'::regprocedure
           AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> 0
           AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION tenure_report_worker(text, bigint, text, '
                       'integer, integer, integer, timestamptz, text[], jsonb) TO %s', r.grantee);
    END LOOP;
END
$$;
