-- The admission's two helpers keep their plans (issue 33). `tenure_admitted`
-- (0015) was a `LANGUAGE sql` function with a `SET` clause, which PostgreSQL
-- cannot inline: it parsed and planned its query again in every transaction
-- that called it, and every step's CAS calls it (`pg_stat_statements` after
-- 100 three-step jobs: 300 calls, 300 plans; 16% of a three-step job's
-- PostgreSQL instructions, BENCHMARKS.md "Plans kept"). As PL/pgSQL its
-- query's plan is cached for the session, like every other statement of the
-- fenced path (`tests/tests/plans.rs` holds the path to that).
--
-- Neither helper has a `SET` clause any more (saving the search_path's save
-- and restore on each call); both are called only by this schema's SECURITY
-- DEFINER functions, which pin the search_path themselves, and still every
-- name they use carries its schema (the function is made by `format` with
-- this schema's name) or `pg_catalog`'s. `CREATE OR REPLACE` keeps their
-- owner and their privileges (EXECUTE revoked from PUBLIC in 0015).
DO $do$
BEGIN
    EXECUTE format($fn$
CREATE OR REPLACE FUNCTION tenure_admitted(p_id uuid, p_fence bigint) RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM %1$I.guard_admissions a
                    WHERE a.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
                      AND a.txid OPERATOR(pg_catalog.=) pg_catalog.txid_current()
                      AND a.job_id OPERATOR(pg_catalog.=) p_id
                      AND a.fence OPERATOR(pg_catalog.=) p_fence);
END
$$
$fn$, current_schema());
    EXECUTE format($fn$
CREATE OR REPLACE FUNCTION tenure_record_admission(p_id uuid, p_fence bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO %1$I.guard_admissions AS a (pid, txid, job_id, fence)
    VALUES (pg_catalog.pg_backend_pid(), pg_catalog.txid_current(), p_id, p_fence)
    ON CONFLICT (pid) DO UPDATE
        SET txid = EXCLUDED.txid, job_id = EXCLUDED.job_id, fence = EXCLUDED.fence;
    PERFORM pg_catalog.set_config('tenure.job_id', p_id::pg_catalog.text, true),
            pg_catalog.set_config('tenure.fence', p_fence::pg_catalog.text, true);
END
$$
$fn$, current_schema());
END
$do$;
