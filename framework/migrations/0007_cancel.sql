-- Operator cancel (`Client::cancel`, `tenure cancel`): a fourth way for a job
-- to end. `cancelled` is terminal like `done` and `dead`: the claim
-- (`status IN ('pending', 'running')`), the admission and `tenure_step_cas`
-- (`status = 'running'`) all refuse it, so nothing an owner commits after the
-- cancel's own commit commits. The cancel is `FenceStore::cancel_job`'s
-- `UPDATE`; it takes the row lock, so it waits behind a step's open fenced
-- transaction (the client notifies the owner first, over NATS, so the step
-- rolls back instead of being waited for).
ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('pending', 'running', 'done', 'dead', 'cancelled'));
-- The operator's reason and the cancel's commit time (both NULL unless cancelled).
ALTER TABLE jobs ADD COLUMN cancel_reason text;
ALTER TABLE jobs ADD COLUMN cancelled_at timestamptz;

-- The history trigger of 0005, with one more end: `cancelled`, its detail the
-- operator's reason.
CREATE OR REPLACE FUNCTION tenure_job_history() RETURNS trigger
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
    IF NEW.status <> OLD.status AND NEW.status IN ('done', 'dead', 'cancelled') THEN
        INSERT INTO job_events (job_id, kind, token, step, worker, attempts, takeovers, detail)
        VALUES (NEW.id, NEW.status, NEW.fence, NEW.step, who, NEW.attempts, NEW.takeovers,
                CASE NEW.status WHEN 'dead' THEN to_jsonb(NEW.last_error)
                                WHEN 'cancelled' THEN to_jsonb(NEW.cancel_reason) END);
    ELSIF OLD.status = 'dead' AND NEW.status = 'pending' THEN
        INSERT INTO job_events (job_id, kind, token, step, worker)
        VALUES (NEW.id, 'redriven', NEW.fence, NEW.step, who);
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION tenure_job_history() FROM PUBLIC;
