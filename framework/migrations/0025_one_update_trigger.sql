-- One row trigger for every UPDATE of `jobs` (issue 33): the update wall of
-- 0015 (`jobs_update_wall`) and the history's trail of 0024 (`jobs_history`)
-- were two PL/pgSQL triggers firing on the claim and on every step's CAS;
-- the wall alone cost 4.1% of a three-step job's PostgreSQL instructions, a
-- third of it the `SET search_path` of its function (BENCHMARKS.md, "What
-- least privilege costs"). Now `jobs_change` runs the wall's checks and then,
-- unless the history is switched off, the trail's append.
--
-- The history switch is the trigger's argument ('history_off'), no longer
-- `DISABLE TRIGGER`: switching the history off must never take the wall with
-- it. The function has no `SET` clause; every name it uses that a caller's
-- `search_path` could shadow is written with its schema (`tenure_is_owner`,
-- the event type: the function is made by `format` with this schema's name)
-- or with `pg_catalog` (the wall's operators).
DO $do$
BEGIN
    EXECUTE format($fn$
CREATE FUNCTION tenure_job_change() RETURNS trigger
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
REVOKE ALL ON FUNCTION tenure_job_change() FROM PUBLIC;

-- The history keeps its state: a schema whose history was off stays off.
DO $do$
DECLARE
    was_on boolean := (SELECT tgenabled <> 'D' FROM pg_trigger
                        WHERE tgrelid = 'jobs'::regclass AND tgname = 'jobs_history');
BEGIN
    DROP TRIGGER jobs_history ON jobs;
    DROP TRIGGER jobs_update_wall ON jobs;
    IF was_on THEN
        CREATE TRIGGER jobs_change BEFORE UPDATE ON jobs
            FOR EACH ROW EXECUTE FUNCTION tenure_job_change();
    ELSE
        CREATE TRIGGER jobs_change BEFORE UPDATE ON jobs
            FOR EACH ROW EXECUTE FUNCTION tenure_job_change('history_off');
    END IF;
END
$do$;
DROP FUNCTION tenure_job_trail();
DROP FUNCTION tenure_jobs_update_wall();
