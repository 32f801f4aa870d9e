package main

// All SQL of the soak lives here.

// sqlCreateEffects is the effects table every transport's handler writes one
// row per processed message into, inside the claim's transaction.
const sqlCreateEffects = `CREATE TABLE IF NOT EXISTS soak_effects (
    id        bigserial PRIMARY KEY,
    transport text NOT NULL,
    msg_id    text NOT NULL,
    attempt   bigint -- the outcomeLog's attempt number, where there is one
);
CREATE INDEX IF NOT EXISTS soak_effects_transport ON soak_effects (transport)`

// sqlInsertEffect records one effect. $1 transport, $2 message id.
const sqlInsertEffect = `INSERT INTO soak_effects (transport, msg_id) VALUES ($1, $2)`

// sqlInsertAttemptEffect records one effect and its attempt number. $1
// transport, $2 message id, $3 attempt (NULL: none).
const sqlInsertAttemptEffect = `INSERT INTO soak_effects (transport, msg_id, attempt) VALUES ($1, $2, $3)`

// sqlEffectAttempts returns the attempt numbers of a transport's effects. $1
// transport.
const sqlEffectAttempts = `SELECT attempt FROM soak_effects WHERE transport = $1 AND attempt IS NOT NULL`

// sqlEffectCounts returns the effects of one transport per message id.
// $1 transport.
const sqlEffectCounts = `SELECT msg_id, count(*) FROM soak_effects WHERE transport = $1 GROUP BY msg_id`

// sqlInboxKeys returns the keys of a scope with their state and attempts:
// after every input was acknowledged each must be complete or failed. $1
// scope.
const sqlInboxKeys = `SELECT key, state, attempts FROM dedupe_inbox WHERE scope = $1`

// sqlStuckPastLease counts in-flight keys of a scope whose lease already ran
// out on the database's clock (a holder died and nobody took over). $1
// scope.
const sqlStuckPastLease = `SELECT count(*) FROM dedupe_inbox
WHERE scope = $1 AND state = 'in_flight' AND locked_until IS NOT NULL AND locked_until < clock_timestamp()`

// sqlSettled counts the inputs of a transport that have an effect, and its
// failed keys of inputs designed to fail (f-…). $1 transport, $2 scope.
const sqlSettled = `SELECT (SELECT count(DISTINCT msg_id) FROM soak_effects WHERE transport = $1),
    (SELECT count(*) FROM dedupe_inbox WHERE scope = $2 AND state = 'failed' AND key LIKE 'f-%')`

// sqlBackends lists the server processes of the consumer's connections.
// $1 application_name.
const sqlBackends = `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`

// sqlTerminate kills one server process. $1 pid.
const sqlTerminate = `SELECT pg_terminate_backend($1)`

// sqlTerminateRun ends the connections one run left behind. $1
// application_name pattern of the run, $2 the admin's name to spare.
const sqlTerminateRun = `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name LIKE $1 AND application_name <> $2 AND pid <> pg_backend_pid()`

// sqlInsertEffects records the effects of a batch. $1 transport, $2 ids.
const sqlInsertEffects = `INSERT INTO soak_effects (transport, msg_id) SELECT $1, unnest($2::text[])`

// sqlEffectTotal counts the effects of a transport, its progress. $1
// transport.
const sqlEffectTotal = `SELECT count(*) FROM soak_effects WHERE transport = $1`

// sqlToken reads the claim token of a key. $1 scope, $2 key.
const sqlToken = `SELECT token FROM dedupe_inbox WHERE scope = $1 AND key = $2`
