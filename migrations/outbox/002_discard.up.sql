-- Discard: an operator takes a parked message out of the pending rows for
-- good (Outbox.Discard, "dedupe outbox discard"), so that the later messages
-- of its key move up. The row keeps the record: when, who and why. A
-- discarded row has published_at set too (it left the outbox) and is cleaned
-- up after the relay's retention like a published one.
ALTER TABLE {{.Outbox}}
    ADD COLUMN IF NOT EXISTS discarded_at   timestamptz,
    ADD COLUMN IF NOT EXISTS discarded_by   text,
    ADD COLUMN IF NOT EXISTS discard_reason text;
