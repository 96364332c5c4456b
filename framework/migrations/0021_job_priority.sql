-- A job's priority level (issue 35, item 5), recorded at enqueue: every
-- message published for the job after its first (the scheduler leader's
-- publish of a delayed or handed-over job, a redrive, a retry-now, the
-- compensation message of a given-up job, a transactional enqueue's
-- republish) goes to the level's subject, so a job keeps its level for its
-- whole life. Written once by the insert, never updated.
ALTER TABLE jobs ADD COLUMN priority text NOT NULL DEFAULT 'normal'
    CONSTRAINT jobs_priority_level CHECK (priority IN ('high', 'normal', 'low'));

-- Upgrade: a role that may insert jobs (the column grant of
-- `FenceStore::grant_producer`, which now names `priority`) may write the
-- new column too, so producers keep enqueueing without a new grant run.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                             ELSE quote_ident(a.grantee::regrole::text) END AS grantee
          FROM pg_attribute att, aclexplode(att.attacl) a
         WHERE att.attrelid = 'jobs'::regclass
           AND att.attname = 'id'
           AND a.privilege_type = 'INSERT'
    LOOP
        EXECUTE format('GRANT INSERT (priority) ON jobs TO %s', r.grantee);
    END LOOP;
END
$$;
