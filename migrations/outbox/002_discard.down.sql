ALTER TABLE {{.Outbox}}
    DROP COLUMN IF EXISTS discard_reason,
    DROP COLUMN IF EXISTS discarded_by,
    DROP COLUMN IF EXISTS discarded_at;
