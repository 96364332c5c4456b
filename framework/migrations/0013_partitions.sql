-- Partition mode (`Config::partitions`).
--
-- `partitioning` records, once, how the namespace's jobs are owned: by one etcd
-- lock per job (0) or by partitions of each job type (the count). Workers and
-- clients check their configuration against it at start and refuse another:
-- a job published to a partition subject that no consumer filters would wait
-- forever, and two ownership schemes on one job would not exclude each other.
CREATE TABLE partitioning (
    only_row    boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    partitions  integer     NOT NULL CHECK (partitions >= 0),
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The fence of each owned partition of each job type: the largest etcd token
-- (the partition key's create_revision) an owner claimed it with, raised
-- strictly, once per change of owner. A claim that finds its own token (or a
-- larger one) is refused: etcd's revisions went backwards, or the claimant is
-- stale. Job rows are fenced per job, under the partition's token (see
-- `guide::protocol`, partition mode); nothing reads this row per job.
CREATE TABLE partition_fences (
    job_type    text        NOT NULL,
    partition   integer     NOT NULL CHECK (partition >= 0),
    fence       bigint      NOT NULL CHECK (fence > 0),
    worker      text        NOT NULL,
    since       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_type, partition)
);
