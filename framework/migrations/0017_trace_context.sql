-- The producer's W3C trace context (`{"traceparent": ..., "tracestate": ...}`),
-- written at enqueue when the producer has a valid span (NULL otherwise), so
-- a job published later (delayed, outbox, batch, cron) joins the producer's
-- trace: the due-job publisher restores it around its publish. See
-- `telemetry::propagation`.
--
-- Upgrade: the producer role's column grant (`FenceStore::grant_producer`)
-- names this column; run the grants again after this migration.
ALTER TABLE jobs ADD COLUMN trace_context jsonb;
