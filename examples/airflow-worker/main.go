package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/examples/exampledb"
)

// usage prints what the worker reads from its environment, then its flags.
func usage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), `Usage: airflow-worker [flags]

Run as an Airflow task (BashOperator, append_env=True): it credits -account
once per logical task run, whatever the number of tries. The run is read
from the variables Airflow sets for the task:

  AIRFLOW_CTX_DAG_ID, AIRFLOW_CTX_TASK_ID, AIRFLOW_CTX_DAG_RUN_ID
      the run's key, dag_id/task_id/run_id (required)
  AIRFLOW_CTX_TRY_NUMBER
      logged and stored, never part of the key: it changes on every retry
  AIRFLOW_CTX_LOGICAL_DATE (Airflow 3), AIRFLOW_CTX_EXECUTION_DATE (Airflow 2)
      stored with the credit
  DATABASE_URL
      PostgreSQL, unless -database-url (else `+exampledb.LocalURL+`)

Exit codes: 0 written by this try or an earlier one; 1 failed, nothing
written (Airflow retries); 2 no Airflow context or bad flags.

Flags:
`)
	fs.PrintDefaults()
}

// Exit codes. Airflow retries a task that exits non-zero.
const (
	exitOK     = 0 // written by this try, or already by an earlier one
	exitFailed = 1 // the work or the database failed; a retry will try again
	exitUsage  = 2 // bad flags or no Airflow context; nothing was written
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the worker: it reads the task run from getenv, writes its effects
// once per logical run and returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("airflow-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg      workerConfig
		mapIndex int
		timeout  time.Duration
	)
	fs.Usage = func() { usage(fs) }
	databaseURL := exampledb.Flag(fs, getenv)
	fs.StringVar(&cfg.scope, "scope", "airflow-worker", "inbox scope of this worker's keys.")
	fs.IntVar(&mapIndex, "map-index", -1, "map index of a mapped task (pass {{ ti.map_index }}); -1 when the task is not mapped.")
	fs.StringVar(&cfg.account, "account", "payouts", "account credited once per run.")
	fs.Int64Var(&cfg.amount, "amount", 100, "credit in cents.")
	fs.DurationVar(&cfg.hold, "hold", 0, "keep the transaction open this long before committing (demo). Defaults to 0.")
	fs.DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	tr, err := taskRunFromEnv(getenv, mapIndex)
	if err != nil {
		log.Error("cannot identify the task run", "err", err)
		return exitUsage
	}
	log = log.With("dag_id", tr.DagID, "task_id", tr.TaskID, "run_id", tr.RunID, "try", tr.Try)

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pool, err := connect(ctx, *databaseURL)
	if err != nil {
		log.Error("connect", "err", err)
		return exitUsage
	}
	defer pool.Close()
	if err := prepare(ctx, pool); err != nil {
		log.Error("prepare tables", "err", err)
		return exitFailed
	}
	w, err := newWorker(pool, cfg, log)
	if err != nil {
		log.Error("worker", "err", err)
		return exitUsage
	}
	outcome, err := w.handle(ctx, tr)
	switch {
	case err == nil && outcome == dedupe.OutcomeClaimed:
		fmt.Fprintf(stdout, "wrote run %s (try %d): credited %d cents to %s\n", tr.Key(), tr.Try, cfg.amount, cfg.account)
		return exitOK
	case err == nil && outcome == dedupe.OutcomeDuplicate:
		fmt.Fprintf(stdout, "run %s was already written by an earlier try; nothing to do (try %d)\n", tr.Key(), tr.Try)
		return exitOK
	case errors.Is(err, dedupe.ErrPoisoned):
		log.Error("the run's key is marked failed after repeated failures; release it with 'dedupe release' to retry",
			"scope", cfg.scope, "key", tr.Key(), "err", err)
	default:
		log.Error("the run failed; nothing was written and a retry will try again", "outcome", outcome.String(), "err", err)
	}
	return exitFailed
}

// connect opens a small pool.
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("invalid database URL")
	}
	cfg.MaxConns = 2
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "airflow-worker"
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// prepare creates the inbox and the worker's tables if they are missing,
// under an advisory lock so that concurrent tries do not race on CREATE. A
// production deployment runs "dedupe migrate up" once instead.
func prepare(ctx context.Context, pool *pgxpool.Pool) error {
	if err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{}); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLockTables); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlCreateTables)
		return err
	})
}
