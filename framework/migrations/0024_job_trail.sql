-- The job history on the job's own row (issue 33.3). Until now the trigger
-- `jobs_history` inserted one `job_events` row per change, six for a
-- three-step job, each with its heap tuple, its WAL and three index entries:
-- 22% of a job's PostgreSQL instructions (BENCHMARKS.md, "Where the job
-- history's cost goes"). The row is rewritten by every change anyway, so the
-- events now ride on it: `jobs.trail`, an array of `tenure_event`, appended
-- to by a BEFORE trigger in the same `UPDATE` (a rolled-back change leaves no
-- event, as before), and begun by the column's default at the enqueue.
--
-- What a step's and a done event leave out: the writer, attempts and
-- takeovers (NULL in the trail; `job_history` carries them forward from the
-- event before, which is the claim or failure that set them: only the
-- fenced owner commits a step, and only a claim, a failure or a redrive
-- changes those counts), and the step's output (the old `step` event copied
-- the checkpoint; the row keeps the last one). `job_events` keeps what the
-- functions write beside a change (`stale_refused`, `retried_now`,
-- `rescheduled`) and every event written before this migration.
-- `job_history` is the one place that reads both.
CREATE TYPE tenure_event AS (
    at          timestamptz,
    kind        text,
    token       bigint,
    other_token bigint,
    step        integer,
    worker      text,
    attempts    integer,
    takeovers   integer,
    detail      text
);

-- Rows enqueued before this migration keep a NULL trail (their events are
-- in `job_events`); a new row's trail begins with its `enqueued` event.
ALTER TABLE jobs ADD COLUMN trail tenure_event[];
ALTER TABLE jobs ALTER COLUMN trail SET DEFAULT ARRAY[ROW(
    clock_timestamp(), 'enqueued', 0, NULL, 0,
    nullif(current_setting('application_name', true), ''), 0, 0, NULL)::tenure_event];

-- The events of one change, as the old trigger told them apart. Not SECURITY
-- DEFINER and no SET clause (it only edits the new row, and either would
-- cost a role or search_path switch on every firing: 44,000 instructions a
-- job, counted), so the one name it uses, the event type, is written with
-- its schema: the function is made by `format` with this schema's name.
DO $do$
BEGIN
    EXECUTE format($fn$
CREATE FUNCTION tenure_job_trail() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    t timestamptz := clock_timestamp();
BEGIN
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
REVOKE ALL ON FUNCTION tenure_job_trail() FROM PUBLIC;

-- The trigger keeps its name (`FenceStore::set_job_history` switches it) and
-- its state: a schema whose history was off stays off, without an
-- `enqueued` default either.
DO $do$
DECLARE
    was_on boolean := (SELECT tgenabled <> 'D' FROM pg_trigger
                        WHERE tgrelid = 'jobs'::regclass AND tgname = 'jobs_history');
BEGIN
    DROP TRIGGER jobs_history ON jobs;
    CREATE TRIGGER jobs_history BEFORE UPDATE ON jobs
        FOR EACH ROW EXECUTE FUNCTION tenure_job_trail();
    IF NOT was_on THEN
        ALTER TABLE jobs DISABLE TRIGGER jobs_history;
        ALTER TABLE jobs ALTER COLUMN trail SET DEFAULT '{}';
    END IF;
END
$do$;
DROP FUNCTION tenure_job_history();

-- Every event of a job, wherever it is kept: the rows of `job_events`
-- (`seq` set, `pos` 0) and the trail of its row (`seq` NULL, `pos` its place
-- in the trail, 1 first). A trail event without a writer (a step, a done)
-- takes the writer, attempts and takeovers of the nearest event before it
-- that has one. The operators' reads and the checkers read this (only the
-- window counts, which need no writer, unnest the trail themselves); a
-- job's events in order are `ORDER BY at, pos, seq`.
-- `row_updated_at`: the row's `updated_at` for a trail event (NULL for a
-- `job_events` row). Every change that writes an event sets `updated_at =
-- now()`, so a trail event is later than its row's `updated_at` by at most
-- its transaction's age: a read of recent events filters on it (a plain
-- scan of `jobs`, without unnesting every trail) with that much slack.
CREATE VIEW job_history AS
SELECT e.job_id, e.seq, 0::bigint AS pos, e.at, e.kind, e.token, e.other_token, e.step,
       e.worker, e.attempts, e.takeovers, e.detail, NULL::timestamptz AS row_updated_at
  FROM job_events e
UNION ALL
SELECT j.id, NULL::bigint, t.pos, t.at, t.kind, t.token, t.other_token, t.step,
       coalesce(t.worker, (j.trail[t.named]).worker), coalesce(t.attempts, (j.trail[t.named]).attempts),
       coalesce(t.takeovers, (j.trail[t.named]).takeovers), to_jsonb(t.detail), j.updated_at
  FROM jobs j
 CROSS JOIN LATERAL (
       -- `named`: the place of the latest event so far with a writer.
       SELECT u.*, max(u.pos) FILTER (WHERE u.worker IS NOT NULL) OVER (ORDER BY u.pos) AS named
         FROM unnest(j.trail) WITH ORDINALITY
              AS u(at, kind, token, other_token, step, worker, attempts, takeovers, detail, pos)) t;

-- Whoever may read `job_events` (the operators of `FenceStore::grant_operator`)
-- may read the history as a whole.
DO $do$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee::regrole::text AS who
               FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'job_events'::regclass AND a.privilege_type = 'SELECT'
                AND a.grantee <> c.relowner AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT SELECT ON job_history TO %s', r.who);
    END LOOP;
END
$do$;
