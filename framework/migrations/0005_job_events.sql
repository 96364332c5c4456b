-- A job's history, for operators (the web view's timeline, overview counts):
-- one row per claim, takeover, step commit, failure, release, end and redrive,
-- written by a trigger on `jobs` in the same transaction as the change (so a
-- rolled-back step leaves no event), plus the stale writes the fence refused
-- (`tenure_record_refusal`, called by `fence` after a refusal, outside the
-- refused transaction). `worker` is the writer's `application_name`, which
-- `fence::pool_options` sets to `Config::worker_id`. Append-only; nothing reads
-- it to decide anything.
CREATE TABLE job_events (
    seq         bigserial   PRIMARY KEY,
    job_id      uuid        NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- enqueued, claimed, taken_over, step, failed, released, done, dead,
    -- redriven, stale_refused
    kind        text        NOT NULL,
    -- The fence the event happened under (for stale_refused: the refused token).
    token       bigint,
    -- claimed / taken_over: the fence before; stale_refused: the fence that won.
    other_token bigint,
    step        integer,
    worker      text,
    attempts    integer,
    takeovers   integer,
    -- step: the checkpoint; failed / dead: the error text; stale_refused: where.
    detail      jsonb
);

CREATE INDEX job_events_job_idx ON job_events (job_id, seq);
CREATE INDEX job_events_kind_at_idx ON job_events (kind, at);
-- The web view's job list filters by type and by "has takeovers", newest first.
CREATE INDEX jobs_type_created_idx ON jobs (job_type, created_at, id);
CREATE INDEX jobs_takeovers_created_idx ON jobs (created_at, id) WHERE takeovers > 0;

CREATE FUNCTION tenure_job_history() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    who text := nullif(current_setting('application_name', true), '');
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO job_events (job_id, kind, token, step, worker)
        VALUES (NEW.id, 'enqueued', NEW.fence, NEW.step, who);
        RETURN NULL;
    END IF;
    IF NEW.fence > OLD.fence THEN
        INSERT INTO job_events (job_id, kind, token, other_token, step, worker, attempts, takeovers)
        VALUES (NEW.id, CASE WHEN NEW.took_over THEN 'taken_over' ELSE 'claimed' END,
                NEW.fence, OLD.fence, NEW.step, who, NEW.attempts, NEW.takeovers);
    END IF;
    IF NEW.step > OLD.step THEN
        INSERT INTO job_events (job_id, kind, token, step, worker, attempts, takeovers, detail)
        VALUES (NEW.id, 'step', NEW.fence, OLD.step, who, NEW.attempts, NEW.takeovers, NEW.checkpoint);
    END IF;
    IF NEW.attempts > OLD.attempts THEN
        INSERT INTO job_events (job_id, kind, token, step, worker, attempts, takeovers, detail)
        VALUES (NEW.id, 'failed', NEW.fence, NEW.step, who, NEW.attempts, NEW.takeovers,
                to_jsonb(NEW.last_error));
    END IF;
    IF NEW.released AND NOT OLD.released THEN
        INSERT INTO job_events (job_id, kind, token, step, worker)
        VALUES (NEW.id, 'released', NEW.fence, NEW.step, who);
    END IF;
    IF NEW.status <> OLD.status AND NEW.status IN ('done', 'dead') THEN
        INSERT INTO job_events (job_id, kind, token, step, worker, attempts, takeovers, detail)
        VALUES (NEW.id, NEW.status, NEW.fence, NEW.step, who, NEW.attempts, NEW.takeovers,
                CASE WHEN NEW.status = 'dead' THEN to_jsonb(NEW.last_error) END);
    ELSIF OLD.status = 'dead' AND NEW.status = 'pending' THEN
        INSERT INTO job_events (job_id, kind, token, step, worker)
        VALUES (NEW.id, 'redriven', NEW.fence, NEW.step, who);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_history AFTER INSERT OR UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION tenure_job_history();

-- A refused stale write, recorded by `fence` after the refusal (the refused
-- transaction itself rolls back). SECURITY DEFINER: the worker role needs no
-- privilege on `job_events`.
CREATE FUNCTION tenure_record_refusal(p_id uuid, p_token bigint, p_current bigint,
                                      p_step integer, p_where text)
RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    INSERT INTO job_events (job_id, kind, token, other_token, step, worker, detail)
    VALUES (p_id, 'stale_refused', p_token, p_current, p_step,
            nullif(current_setting('application_name', true), ''), to_jsonb(p_where));
$$;
REVOKE ALL ON FUNCTION tenure_record_refusal(uuid, bigint, bigint, integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION tenure_job_history() FROM PUBLIC;
