-- Delayed jobs and cron schedules.
--
-- A delayed job's row is inserted at enqueue with `run_at` in the future and
-- `awaiting_publish`; no message exists for it until the elected scheduler
-- leader publishes it once due, so a waiting job costs the broker nothing. The
-- partial index holds only waiting rows: the leader's due query reads the
-- front of it, however many rows wait.
ALTER TABLE jobs ADD COLUMN run_at timestamptz;
ALTER TABLE jobs ADD COLUMN awaiting_publish boolean NOT NULL DEFAULT false;
CREATE INDEX jobs_due_idx ON jobs (run_at, id) WHERE awaiting_publish;

-- The fence of each elected role (today: `scheduler`): the largest etcd
-- token (the leader key's create_revision) a leader claimed it with. Every
-- write of a leader locks this row and checks `fence = its token` in the same
-- transaction, so a deposed leader's writes are refused once its successor
-- has claimed.
CREATE TABLE leader_fences (
    role        text        PRIMARY KEY,
    fence       bigint      NOT NULL CHECK (fence > 0),
    worker      text        NOT NULL,
    since       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Cron schedules: each worker upserts the definitions it was built with at
-- start (for operators: `tenure schedules`); the leader advances `last_tick`
-- (the newest tick decided, enqueued or skipped) and `next_tick`, fenced.
CREATE TABLE schedules (
    name          text        PRIMARY KEY,
    job_type      text        NOT NULL,
    expr          text        NOT NULL,
    time_zone     text        NOT NULL,
    -- skip, or catch_up:<max>
    missed        text        NOT NULL,
    input         jsonb       NOT NULL,
    last_tick     timestamptz,
    next_tick     timestamptz,
    enqueued      bigint      NOT NULL DEFAULT 0,
    skipped       bigint      NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
