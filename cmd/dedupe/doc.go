// Command dedupe operates the inbox tables of github.com/exactlyonce/dedupe
// and runs shell commands at most once per key.
//
// Usage:
//
//	dedupe [global flags] <command> [flags] [args]
//
// Commands:
//
//	migrate [up|status|sql]          create or upgrade the inbox table, list migrations, print the SQL
//	inspect --scope S --key K        show one key: state, attempts, lease, stored result, last error
//	inspect --scope S --prefix P     list keys by prefix (and --state): the messages an adapter refused
//	stats                            count keys by scope and state, the oldest in-flight key, the outbox lag
//	purge [--older-than D]           delete expired keys in bounded batches, showing progress
//	release --scope S --key K --yes  delete one key so that it is claimed afresh
//	outbox parked|unpark|discard     list parked outbox messages, retry one, or drop one for good
//	run --scope S --key K -- CMD     run CMD at most once per key, under a renewed lease
//
// Global flags, accepted before or after the command name:
//
//	--database-url URL  PostgreSQL connection URL. Defaults to $DATABASE_URL, else
//	                    postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
//	--schema S          schema of the inbox table. Defaults to the connection's search_path.
//	--table T           inbox table name. Defaults to dedupe_inbox.
//	--outbox-table T    transactional outbox table (migrate, stats, outbox). Defaults to dedupe_outbox.
//	--json              machine-readable output (for run: its report, on stderr).
//	--verbose           debug logs on stderr.
//
// Every command has --help.
//
// # dedupe run
//
// run is for shell tasks started by schedulers that retry (Airflow, cron,
// Kubernetes Jobs). It claims the key in leased mode (dedupe.Inbox.Begin),
// renews the lease every --heartbeat (Inbox.Extend) while CMD runs, and when
// CMD ends stores its exit status in Result.Status and the last --tail bytes
// of its output in Result.Body (Inbox.Complete). A non-zero exit releases the
// key at once (Inbox.Fail) so that a retry runs CMD again, unless
// --on-failure=complete (the status is final and replayed to later runs) or
// --on-failure=poison (the key is marked failed). After --max-attempts
// failures the key is marked failed too.
//
// A complete key makes later runs exit 0 without running CMD. A key whose
// lease is live elsewhere exits 75 without running CMD. On Linux CMD runs
// under a supervisor (dedupe itself) that keeps every process of the job in
// it: by default in a PID namespace of its own where dedupe may make one
// (root), else as the job's child subreaper (--contain). When dedupe itself
// is killed, SIGKILL included, no process of the job outlives it; the lease
// expires after --lease, after which a later run takes the key over. A lost
// lease kills the job at once, and what CMD leaves running when it exits is
// killed before the outcome is recorded. Other systems run CMD directly and
// contain nothing: there a killed dedupe leaves CMD running.
// CMD gets DEDUPE_SCOPE, DEDUPE_KEY, DEDUPE_ATTEMPT and
// DEDUPE_IDEMPOTENCY_KEY (stable across retries, for downstream APIs).
//
// The key must name the logical run, never the attempt. For Airflow:
//
//	dedupe run --scope airflow --key "$AIRFLOW_CTX_DAG_ID/$AIRFLOW_CTX_TASK_ID/$AIRFLOW_CTX_DAG_RUN_ID" -- ./task.sh
//
// never AIRFLOW_CTX_TRY_NUMBER, which changes on every retry.
//
// # Exit codes
//
//	0    success; for run: the command exited 0, or the key was already complete
//	     (a key completed with --on-failure=complete replays its stored status)
//	1    error: the database or the operation failed
//	2    usage: bad flags or arguments, invalid key, a database URL that does
//	     not parse (with none, dedupe uses the local default: see --database-url)
//	3    inspect, release: no such key; outbox unpark, discard: no such parked message
//	4    the inbox table does not exist (run "dedupe migrate up")
//	75   the key is in flight elsewhere (a live lease); retry later
//	76   run: the key is marked failed; "dedupe release" it to allow another run
//	77   run: the key was already used with a different command
//	125  run: dedupe failed around the command (database error, lease lost)
//	126  run: the command could not be started
//	127  run: the command was not found
//	N    run: any other status is the command's own (128+n: killed by signal n)
//
// A command's own status can coincide with 75, 76, 77 or 125; use --json and
// read the report's "outcome" to tell them apart.
package main
