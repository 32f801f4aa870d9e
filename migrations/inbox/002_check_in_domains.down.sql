ALTER TABLE {{.Inbox}}
    ALTER COLUMN scope TYPE text,
    ALTER COLUMN key   TYPE text,
    ALTER COLUMN state TYPE text;
DROP DOMAIN IF EXISTS {{.InboxKeyDomain}};
DROP DOMAIN IF EXISTS {{.InboxStateDomain}};
ALTER TABLE {{.Inbox}}
    ADD CHECK (octet_length(scope) BETWEEN 1 AND 255),
    ADD CHECK (octet_length(key) BETWEEN 1 AND 255),
    ADD CHECK (state IN ('in_flight', 'complete', 'failed'));
