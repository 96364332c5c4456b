-- Step-list versions.
--
-- A job row records the step names of the definition it was enqueued with (or,
-- for a row enqueued by name or by a scheduler tick, of the first worker that
-- claimed it) and their fingerprint. A worker resumes a job only if the steps
-- already committed are the same steps, in the same order, in its own
-- definition, and its definition is not shorter than the recorded one;
-- otherwise it releases the job for a worker with a compatible definition and
-- marks since when no compatible worker took it (`incompatible_since`). Past the
-- configured grace, the job is dead-lettered as `definition_changed`. A
-- compatible claim records its own step list and clears the mark.
ALTER TABLE jobs ADD COLUMN step_names text[];
ALTER TABLE jobs ADD COLUMN steps_fingerprint text;
ALTER TABLE jobs ADD COLUMN incompatible_since timestamptz;
