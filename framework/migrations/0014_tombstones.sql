-- Tombstones: what deduplication needs of a job row that retention pruned.
--
-- A job's id is its idempotency key (UUIDv5 of type and key), and the row's
-- primary key is what deduplicates an enqueue forever. Pruning the row used to
-- reopen the key: the next enqueue made a new `pending` row and the job ran
-- again. Now every pruned row leaves a tombstone (id, type, a hash of the
-- input, final status, when it finished); an enqueue of a tombstoned key is a
-- duplicate with that status, and the same key with another input is the
-- payload conflict it always was. Tombstones are kept for
-- `Retention::keys_after` (default: forever), pruned by the leader.
--
-- Size: about 160 bytes per tombstone with its two indexes, i.e. about
-- 160 MB per million pruned jobs (measured in tests/tests/operations.rs).
CREATE TABLE job_tombstones (
    id          uuid        PRIMARY KEY,
    job_type    text        NOT NULL,
    -- md5 of the input's canonical jsonb text (`input::text`).
    input_md5   text        NOT NULL,
    status      text        NOT NULL CHECK (status IN ('done', 'dead', 'cancelled')),
    finished_at timestamptz NOT NULL
);
CREATE INDEX job_tombstones_finished_idx ON job_tombstones (finished_at);

-- The insert paths skip a tombstoned id with NOT EXISTS, under the statement's
-- snapshot; this trigger closes the race in which a prune commits while an
-- insert waits on the row it deletes (the insert then goes ahead, after the
-- statement's snapshot was taken). It runs after the insert, with a snapshot
-- of its own, and refuses with SQLSTATE TF003; the insert path then finds the
-- tombstone on its next try.
CREATE FUNCTION tenure_refuse_tombstoned() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM job_tombstones WHERE id = NEW.id) THEN
        RAISE EXCEPTION 'job % was pruned; its idempotency key stays used', NEW.id
            USING ERRCODE = 'TF003';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_refuse_tombstoned AFTER INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION tenure_refuse_tombstoned();

-- Retention now leaves a tombstone per pruned row, and never prunes a row
-- whose compensation (`on_dead` hook) has not ended.
CREATE OR REPLACE FUNCTION tenure_prune_jobs(p_status text, p_older_than_secs double precision,
                                             p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    cutoff timestamptz := clock_timestamp() - make_interval(secs => p_older_than_secs);
    n bigint;
BEGIN
    IF p_status NOT IN ('done', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'tenure_prune_jobs: % is not a finished status', p_status
            USING ERRCODE = '22023';
    END IF;
    WITH chosen AS (
        SELECT id FROM jobs
         WHERE status = p_status AND created_at < cutoff AND updated_at < cutoff
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

-- Tombstones past the key-retention horizon, a batch at a time (the leader,
-- fenced; an operator).
CREATE FUNCTION tenure_prune_tombstones(p_older_than_secs double precision, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    n bigint;
BEGIN
    WITH chosen AS (
        SELECT id FROM job_tombstones
         WHERE finished_at < clock_timestamp() - make_interval(secs => p_older_than_secs)
         ORDER BY finished_at
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM job_tombstones t USING chosen WHERE t.id = chosen.id RETURNING t.id
    )
    SELECT count(*) INTO n FROM gone;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION tenure_prune_tombstones(double precision, integer) FROM PUBLIC;
