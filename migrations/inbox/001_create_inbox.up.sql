-- The inbox: one row per claimed (scope, key).
CREATE TABLE IF NOT EXISTS {{.Inbox}} (
    scope          text        NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 255),
    key            text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 255),
    state          text        NOT NULL CHECK (state IN ('in_flight', 'complete', 'failed')),
    fingerprint    bytea,
    attempts       integer     NOT NULL DEFAULT 1,
    token          bigint      NOT NULL,
    locked_until   timestamptz,
    result_status  integer,
    result_headers jsonb,
    result_body    bytea,
    last_error     text,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

-- Retention purge walks this index in bounded batches.
CREATE INDEX IF NOT EXISTS {{.InboxExpiresIndex}} ON {{.Inbox}} (expires_at);
