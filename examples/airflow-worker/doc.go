// Command airflow-worker is a Go worker started by an Airflow task that
// makes its writes once per logical task run, however often Airflow retries.
//
// Airflow exports the task's identity to the process: AIRFLOW_CTX_DAG_ID,
// AIRFLOW_CTX_TASK_ID and AIRFLOW_CTX_DAG_RUN_ID name the logical run and are
// the same on every try; AIRFLOW_CTX_TRY_NUMBER changes on every retry and is
// therefore only logged, never part of the key (a key per try would let each
// retry write again). The key is dag_id/task_id/run_id, plus the map index
// (-map-index '{{ ti.map_index }}') for a mapped task.
//
// # Why transactional mode
//
// The worker's effects are rows in PostgreSQL, so it uses dedupe.Consumer:
// the claim of the key and the writes commit in one transaction. There is no
// window in which the work is done but not recorded, and no lease: a try
// killed mid-transaction rolls back everything, claim included, and the retry
// writes as if it were the first; a try that committed makes every later one
// exit 0 without writing; two tries running at once (a zombie and its retry)
// serialize on the inbox's unique index and the second sees the first's
// commit.
//
// Work whose side effects live outside the database (an upload, an e-mail,
// a call to a payment API) cannot share the transaction: run it in leased
// mode instead, either with dedupe.Inbox.Begin/Extend/Complete in Go or by
// wrapping the shell command with the operator CLI:
//
//	dedupe run --scope airflow --key "$AIRFLOW_CTX_DAG_ID/$AIRFLOW_CTX_TASK_ID/$AIRFLOW_CTX_DAG_RUN_ID" -- ./upload.sh
//
// and pass DEDUPE_IDEMPOTENCY_KEY on to the external API, which closes the
// remaining gap (a crash after the call but before the completion).
//
// # DAG
//
//	from airflow.providers.standard.operators.bash import BashOperator
//
//	credit = BashOperator(
//	    task_id="credit_payouts",
//	    # The worker reads AIRFLOW_CTX_* itself; Airflow always exports them.
//	    bash_command="/opt/workers/airflow-worker -amount 2500 ",
//	    env={"DATABASE_URL": "{{ conn.payments_db.get_uri() }}"},
//	    append_env=True,
//	    retries=3,
//	)
//
// Exit codes: 0 written by this try or already by an earlier one; 1 failed,
// nothing written, Airflow's retry tries again; 2 no Airflow context or bad
// flags, nothing written.
//
// The worker creates the inbox and its own tables when missing; production
// deployments run "dedupe migrate up" once instead.
package main
