-- Pausing and resuming a cron schedule (issue 35, item 7). A paused schedule
-- enqueues no tick: the scheduler leader reads `paused_at` at each look (every
-- `Tuning::due_poll`) and counts the paused schedule's due ticks as skipped,
-- and `tenure_advance_schedule` refuses a leader's ticks for a paused schedule
-- in the transaction that inserted them (SQLSTATE TF021), so no tick is
-- enqueued after a pause committed, whatever the leader read before. A resume
-- records `resumed_at`: the leader never enqueues a tick due at or before it,
-- so the ticks a pause held back are skipped, never caught up. A trigger
-- ("run now") is an ordinary enqueue (the producer's path) and writes nothing
-- here. Written only through `tenure_pause_schedule` and
-- `tenure_resume_schedule` (the operator's grant).
ALTER TABLE schedules ADD COLUMN paused_at  timestamptz;
-- The pausing session's `application_name` (the operator's tool).
ALTER TABLE schedules ADD COLUMN paused_by  text;
ALTER TABLE schedules ADD COLUMN resumed_at timestamptz;

-- Refuses a name no schedule can have (`Schedule::new`'s rule: 1 to 64 of
-- ASCII letters, digits, `_`, `.` and `-`).
CREATE FUNCTION tenure_check_schedule_name(p_fn text, p_name text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        RAISE EXCEPTION '%: % is not a schedule name', p_fn, left(p_name, 200)
            USING ERRCODE = 'TF020';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION tenure_check_schedule_name(text, text) FROM PUBLIC;

-- Pauses schedule `p_name`: true when it was not paused, false when it was,
-- NULL when no schedule has that name (nothing written).
CREATE FUNCTION tenure_pause_schedule(p_name text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    was timestamptz;
BEGIN
    PERFORM tenure_check_schedule_name('tenure_pause_schedule', p_name);
    SELECT paused_at INTO was FROM schedules WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF was IS NOT NULL THEN
        RETURN false;
    END IF;
    UPDATE schedules SET paused_at = clock_timestamp(),
           paused_by = nullif(current_setting('application_name', true), ''),
           updated_at = clock_timestamp()
     WHERE name = p_name;
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION tenure_pause_schedule(text) FROM PUBLIC;

-- Resumes schedule `p_name`: true when it was paused, false when it was not,
-- NULL when no schedule has that name.
CREATE FUNCTION tenure_resume_schedule(p_name text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    was timestamptz;
BEGIN
    PERFORM tenure_check_schedule_name('tenure_resume_schedule', p_name);
    SELECT paused_at INTO was FROM schedules WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF was IS NULL THEN
        RETURN false;
    END IF;
    UPDATE schedules SET paused_at = NULL, paused_by = NULL,
           resumed_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE name = p_name;
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION tenure_resume_schedule(text) FROM PUBLIC;

-- As in 0015, and a paused schedule takes no tick: the row is locked first,
-- so a pause either committed before (and the ticks this transaction
-- inserted are refused with it, TF021) or waits for this transaction.
-- Advancing with no tick (the paused ticks counted as skipped) is accepted.
CREATE OR REPLACE FUNCTION tenure_advance_schedule(p_role text, p_token bigint, p_name text,
                                                   p_last timestamptz, p_next timestamptz,
                                                   p_enqueued bigint, p_skipped bigint)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    paused timestamptz;
BEGIN
    IF NOT tenure_leader_holds(p_role, p_token) THEN
        RAISE EXCEPTION USING ERRCODE = 'TF005',
            MESSAGE = format('tenure: role %s is no longer held under fence %s', p_role, p_token);
    END IF;
    IF p_enqueued < 0 OR p_skipped < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'tenure: a schedule''s counters only grow';
    END IF;
    SELECT paused_at INTO paused FROM schedules WHERE name = p_name FOR UPDATE;
    IF paused IS NOT NULL AND p_enqueued > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'TF021',
            MESSAGE = format('tenure: schedule %s is paused (since %s): its ticks are refused',
                             p_name, paused);
    END IF;
    UPDATE schedules SET last_tick = greatest(last_tick, p_last), next_tick = p_next,
           enqueued = enqueued + p_enqueued, skipped = skipped + p_skipped,
           updated_at = clock_timestamp()
     WHERE name = p_name;
END
$$;
