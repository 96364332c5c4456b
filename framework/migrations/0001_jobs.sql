-- Tenure job rows. Applied by `FenceStore::migrate` with `search_path` set to the
-- user's schema (first) and `pg_temp` (last), so every name below lands in that
-- schema. Only the `fence` module writes these rows.
CREATE TABLE jobs (
    id          uuid        PRIMARY KEY,
    job_type    text        NOT NULL,
    input       jsonb       NOT NULL,
    -- The largest fencing token (etcd create_revision) this row has accepted; 0 = never claimed.
    fence       bigint      NOT NULL DEFAULT 0 CHECK (fence >= 0),
    -- The next step to run (= number of committed steps).
    step        integer     NOT NULL DEFAULT 0 CHECK (step >= 0),
    -- Output of the last committed step (input of `step`).
    checkpoint  jsonb,
    status      text        NOT NULL DEFAULT 'pending'
                            CHECK (status IN ('pending', 'running', 'done', 'dead')),
    -- The generation `fence` released the job voluntarily (retry, graceful shutdown):
    -- the next claim counts no takeover, and the released generation writes no more.
    released    boolean     NOT NULL DEFAULT false,
    -- Fence before the last claim, and whether the last claim was a takeover.
    prev_fence  bigint      NOT NULL DEFAULT 0,
    took_over   boolean     NOT NULL DEFAULT false,
    takeovers   integer     NOT NULL DEFAULT 0 CHECK (takeovers >= 0),
    attempts    integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX jobs_status_created_idx ON jobs (status, created_at, id);
CREATE INDEX jobs_created_idx ON jobs (created_at, id);
