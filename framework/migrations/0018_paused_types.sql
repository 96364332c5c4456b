-- Pausing a job type fleet-wide (issue 35): one row per paused type. Every
-- worker reads the table every `Tuning::pause_poll` (500 ms) and, while its
-- type is here, fetches none of its messages (they stay in the stream:
-- nothing is redelivered, dead-lettered or counted), starts none of the
-- deliveries it holds and starts no next step of a job it runs (each waits,
-- holding its lock and its message, until the type is resumed). Written only
-- through `tenure_pause` and `tenure_resume` (the operator's grant); the
-- worker role may read it.
CREATE TABLE paused_types (
    job_type   text        PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The pausing session's `application_name` (the operator's tool).
    paused_by  text
);

-- Pauses `p_type`; true when it was not paused before.
CREATE FUNCTION tenure_pause(p_type text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_type IS NULL OR p_type = '' OR length(p_type) > 200 THEN
        RAISE EXCEPTION 'tenure_pause: % is not a job type name', p_type USING ERRCODE = 'TF020';
    END IF;
    INSERT INTO paused_types (job_type, paused_by)
    VALUES (p_type, nullif(current_setting('application_name', true), ''))
    ON CONFLICT (job_type) DO NOTHING;
    RETURN FOUND;
END
$$;

-- Resumes `p_type`; true when it was paused.
CREATE FUNCTION tenure_resume(p_type text)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    WITH gone AS (DELETE FROM paused_types WHERE job_type = p_type RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM gone);
$$;

REVOKE ALL ON FUNCTION tenure_pause(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION tenure_resume(text) FROM PUBLIC;
