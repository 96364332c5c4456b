-- The job row's value checks move from CHECK constraints into the row
-- triggers that already run on every write of `jobs` (issue 33).
--
-- PostgreSQL keeps a table's CHECK constraints as text (node trees in
-- `pg_constraint.conbin`) and parses and prepares every one of them again in
-- each statement that inserts or updates a row: seven of them on `jobs`
-- (three `IN` lists whose array constants are read byte by byte) cost 32% of
-- a three-step job's PostgreSQL instructions (`benches/history_cost.sh`,
-- BENCHMARKS.md "Checks in the triggers"); one CHECK calling a PL/pgSQL
-- function still cost 9 of those 32 points, and OR chains instead of the
-- `IN` lists cost more. A PL/pgSQL trigger's statements keep their plans for
-- the session. So the same conditions are now tested by the insert wall
-- (`jobs_insert_wall`, every insert) and by `jobs_change` (every update,
-- after the update wall's checks, whether the history is on or off), for
-- every writer, the owner included; a refusal is SQLSTATE 23514
-- (check_violation) naming the column's old constraint, as before.
--
-- Both functions keep 0025's form: no `SET` clause, every name that a
-- caller's search_path could shadow written with this schema's name or
-- `pg_catalog`'s (made by `format`).

-- Raises the refusal for a row whose values the triggers' test found out of
-- range (the common path never calls it).
DO $do$
BEGIN
    EXECUTE format($fn$
CREATE FUNCTION tenure_job_values_refused(p_id uuid, p_fence bigint, p_step integer,
                                          p_status text, p_takeovers integer,
                                          p_attempts integer, p_compensation text,
                                          p_priority text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    what text;
BEGIN
    what := CASE
        WHEN p_fence OPERATOR(pg_catalog.<) 0 THEN 'jobs_fence_check'
        WHEN p_step OPERATOR(pg_catalog.<) 0 THEN 'jobs_step_check'
        WHEN p_takeovers OPERATOR(pg_catalog.<) 0 THEN 'jobs_takeovers_check'
        WHEN p_attempts OPERATOR(pg_catalog.<) 0 THEN 'jobs_attempts_check'
        WHEN p_status OPERATOR(pg_catalog.<>) ALL (ARRAY['pending', 'running', 'done', 'dead', 'cancelled']::text[])
            THEN 'jobs_status_check'
        WHEN p_compensation OPERATOR(pg_catalog.<>) ALL (ARRAY['none', 'pending', 'done']::text[])
            THEN 'jobs_compensation_check'
        ELSE 'jobs_priority_level'
    END;
    RAISE EXCEPTION USING
        ERRCODE = 'check_violation',
        CONSTRAINT = what,
        TABLE = 'jobs',
        SCHEMA = %1$L,
        MESSAGE = pg_catalog.format('tenure: job %%s refused by %%s: fence %%s, step %%s, status %%L, takeovers %%s, attempts %%s, compensation %%L, priority %%L',
                         p_id, what, p_fence, p_step, p_status, p_takeovers, p_attempts,
                         p_compensation, p_priority);
END
$$
$fn$, current_schema());
END
$do$;
-- Left executable by PUBLIC: it only raises, and an inserting role (no
-- definer function in between) reaches it through the insert wall.

-- The insert wall of 0015 (a new job is pending with fence 0, unless the
-- owner writes it), and the row's values for every writer.
DO $do$
BEGIN
    EXECUTE format($fn$
CREATE OR REPLACE FUNCTION tenure_jobs_insert_wall() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF (NEW.status OPERATOR(pg_catalog.<>) 'pending' OR NEW.fence OPERATOR(pg_catalog.<>) 0
        OR NEW.step OPERATOR(pg_catalog.<>) 0 OR NEW.released
        OR NEW.compensation OPERATOR(pg_catalog.<>) 'none')
       AND NOT %1$I.tenure_is_owner(TG_RELID) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF004',
            MESSAGE = pg_catalog.format('tenure: job %%s refused: a new job is pending with fence 0 (got status %%s, fence %%s, step %%s)',
                             NEW.id, NEW.status, NEW.fence, NEW.step);
    END IF;
    IF NEW.fence OPERATOR(pg_catalog.<) 0 OR NEW.step OPERATOR(pg_catalog.<) 0
       OR NEW.takeovers OPERATOR(pg_catalog.<) 0 OR NEW.attempts OPERATOR(pg_catalog.<) 0
       OR NEW.status OPERATOR(pg_catalog.<>) ALL (ARRAY['pending', 'running', 'done', 'dead', 'cancelled']::text[])
       OR NEW.compensation OPERATOR(pg_catalog.<>) ALL (ARRAY['none', 'pending', 'done']::text[])
       OR NEW.priority OPERATOR(pg_catalog.<>) ALL (ARRAY['high', 'normal', 'low']::text[]) THEN
        PERFORM %1$I.tenure_job_values_refused(NEW.id, NEW.fence, NEW.step, NEW.status,
                                               NEW.takeovers, NEW.attempts, NEW.compensation,
                                               NEW.priority);
    END IF;
    RETURN NEW;
END
$$
$fn$, current_schema());
END
$do$;

-- The update trigger of 0025 with the row's values tested after the wall.
DO $do$
BEGIN
    EXECUTE format($fn$
CREATE OR REPLACE FUNCTION tenure_job_change() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    t timestamptz;
BEGIN
    -- The wall (was tenure_jobs_update_wall, 0015), whoever writes. One test
    -- on the common path (a live row whose fence holds or rises), the
    -- refusals behind it.
    IF NEW.fence OPERATOR(pg_catalog.<) OLD.fence
       OR OLD.status OPERATOR(pg_catalog.<>) ALL (ARRAY['pending', 'running']::text[]) THEN
        IF NEW.fence OPERATOR(pg_catalog.<) OLD.fence THEN
            RAISE EXCEPTION USING
                ERRCODE = 'TF004',
                MESSAGE = pg_catalog.format('tenure: job %%s refused: a fence only rises (from %%s to %%s)',
                                 OLD.id, OLD.fence, NEW.fence);
        END IF;
        IF OLD.status OPERATOR(pg_catalog.=) ANY (ARRAY['done', 'cancelled']::text[])
           AND NEW.status OPERATOR(pg_catalog.<>) OLD.status THEN
            RAISE EXCEPTION USING
                ERRCODE = 'TF004',
                MESSAGE = pg_catalog.format('tenure: job %%s refused: a %%s job never reopens (to %%s)',
                                 OLD.id, OLD.status, NEW.status);
        END IF;
        IF OLD.status OPERATOR(pg_catalog.=) 'dead'
           AND NOT (NEW.status OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'cancelled']::text[]))
           AND NOT %1$I.tenure_is_owner(TG_RELID) THEN
            RAISE EXCEPTION USING
                ERRCODE = 'TF004',
                MESSAGE = pg_catalog.format('tenure: job %%s refused: a dead job reopens only by an operator''s redrive (tenure_redrive)',
                                 OLD.id);
        END IF;
    END IF;
    -- The row's values (were CHECK constraints until 0027), whoever writes,
    -- after the wall as when they were constraints: one test on the common
    -- path; a text column is looked at only when it changes (the insert
    -- checked it), the fence not at all (the wall refused any fence below
    -- the old one, which is never negative).
    IF NEW.step OPERATOR(pg_catalog.<) 0
       OR NEW.takeovers OPERATOR(pg_catalog.<) 0 OR NEW.attempts OPERATOR(pg_catalog.<) 0
       OR (NEW.status OPERATOR(pg_catalog.<>) OLD.status
           AND NEW.status OPERATOR(pg_catalog.<>) ALL (ARRAY['pending', 'running', 'done', 'dead', 'cancelled']::text[]))
       OR (NEW.compensation OPERATOR(pg_catalog.<>) OLD.compensation
           AND NEW.compensation OPERATOR(pg_catalog.<>) ALL (ARRAY['none', 'pending', 'done']::text[]))
       OR (NEW.priority OPERATOR(pg_catalog.<>) OLD.priority
           AND NEW.priority OPERATOR(pg_catalog.<>) ALL (ARRAY['high', 'normal', 'low']::text[])) THEN
        PERFORM %1$I.tenure_job_values_refused(NEW.id, NEW.fence, NEW.step, NEW.status,
                                               NEW.takeovers, NEW.attempts, NEW.compensation,
                                               NEW.priority);
    END IF;
    IF TG_NARGS > 0 THEN
        RETURN NEW; -- 'history_off'
    END IF;
    -- The history's trail (was tenure_job_trail, 0024).
    t := clock_timestamp();
    IF NEW.fence > OLD.fence THEN
        NEW.trail := NEW.trail || ROW(t,
            CASE WHEN NEW.took_over THEN 'taken_over' ELSE 'claimed' END, NEW.fence, OLD.fence,
            NEW.step, nullif(current_setting('application_name', true), ''),
            NEW.attempts, NEW.takeovers, NULL)::%1$I.tenure_event;
    END IF;
    IF NEW.step > OLD.step THEN
        NEW.trail := NEW.trail
            || ROW(t, 'step', NEW.fence, NULL, OLD.step, NULL, NULL, NULL, NULL)::%1$I.tenure_event;
    END IF;
    IF NEW.status = OLD.status AND NEW.attempts <= OLD.attempts AND NEW.released <= OLD.released THEN
        RETURN NEW;
    END IF;
    IF NEW.attempts > OLD.attempts THEN
        NEW.trail := NEW.trail || ROW(t, 'failed', NEW.fence, NULL, NEW.step,
            nullif(current_setting('application_name', true), ''), NEW.attempts, NEW.takeovers,
            NEW.last_error)::%1$I.tenure_event;
    END IF;
    IF NEW.released > OLD.released THEN
        NEW.trail := NEW.trail || ROW(t, 'released', NEW.fence, NULL, NEW.step,
            nullif(current_setting('application_name', true), ''), NEW.attempts, NEW.takeovers,
            NULL)::%1$I.tenure_event;
    END IF;
    IF NEW.status = OLD.status THEN
        RETURN NEW;
    ELSIF NEW.status = 'done' THEN
        NEW.trail := NEW.trail
            || ROW(t, 'done', NEW.fence, NULL, NEW.step, NULL, NULL, NULL, NULL)::%1$I.tenure_event;
    ELSIF NEW.status IN ('dead', 'cancelled') OR OLD.status = 'dead' THEN
        NEW.trail := NEW.trail || ROW(t,
            CASE WHEN NEW.status IN ('dead', 'cancelled') THEN NEW.status ELSE 'redriven' END,
            NEW.fence, NULL, NEW.step, nullif(current_setting('application_name', true), ''),
            NEW.attempts, NEW.takeovers,
            CASE NEW.status WHEN 'dead' THEN NEW.last_error WHEN 'cancelled' THEN NEW.cancel_reason END
        )::%1$I.tenure_event;
    END IF;
    RETURN NEW;
END
$$
$fn$, current_schema());
END
$do$;

-- The constraints the triggers replace (the names PostgreSQL gave the
-- column constraints of 0001, 0007 and 0011, and 0021's).
ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_fence_check,
                 DROP CONSTRAINT IF EXISTS jobs_step_check,
                 DROP CONSTRAINT IF EXISTS jobs_status_check,
                 DROP CONSTRAINT IF EXISTS jobs_takeovers_check,
                 DROP CONSTRAINT IF EXISTS jobs_attempts_check,
                 DROP CONSTRAINT IF EXISTS jobs_compensation_check,
                 DROP CONSTRAINT IF EXISTS jobs_priority_level;
