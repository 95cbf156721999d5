-- description: a job's meta: the trace context it was enqueued in, kept on dead letters

-- Nullable, no default: a catalog change, whatever the tables hold. NULL for a job
-- enqueued outside a trace, the usual case (pgpool.tracing).
ALTER TABLE pgpool_jobs ADD COLUMN meta jsonb;
ALTER TABLE pgpool_dead ADD COLUMN meta jsonb;
COMMENT ON COLUMN pgpool_jobs.meta IS
    'set at enqueue, never changed: the W3C trace context (traceparent, tracestate) '
    'of the OpenTelemetry span the job was enqueued in, which the worker''s span '
    'links to; NULL outside a trace';
COMMENT ON COLUMN pgpool_dead.meta IS 'the job''s meta, as it was in pgpool_jobs';
