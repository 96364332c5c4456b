-- The step CAS as a function that raises when it matches no row, so that a
-- step's commit can travel in one simple-query string with the COMMIT and the
-- next step's admission (`FencedTx::commit_step_and_begin`): when the CAS is
-- refused, the error aborts the transaction and PostgreSQL skips the rest of
-- the string, COMMIT included. Same predicate as the prepared CAS statement.
CREATE FUNCTION tenure_step_cas(p_id uuid, p_fence bigint, p_step integer,
                                p_out jsonb, p_last boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE jobs
       SET step = step + 1, checkpoint = p_out,
           status = CASE WHEN p_last THEN 'done' ELSE status END,
           updated_at = now()
     WHERE id = p_id AND fence = p_fence AND step = p_step
       AND status = 'running' AND NOT released;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TF002',
            MESSAGE = format('tenure: the commit of step %s of job %s under fence %s matched no row',
                             p_step, p_id, p_fence);
    END IF;
END
$$;
