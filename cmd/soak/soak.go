package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/scratch"
)

// soak is one run: a private schema and the generated inputs.
type soak struct {
	opts   *options
	log    *slog.Logger
	admin  *pgxpool.Pool // outside the consumers' application_name: faults and audits
	schema string
	inputs []string
	unique map[string]bool
	cancel context.CancelFunc
	ctx    context.Context
}

func newSoak(parent context.Context, opts *options, stderr io.Writer) (*soak, error) {
	level := slog.LevelError
	if opts.verbose {
		level = slog.LevelDebug
	}
	s := &soak{opts: opts, log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))}
	if opts.timeout > 0 {
		s.ctx, s.cancel = context.WithTimeout(parent, opts.timeout)
	} else {
		s.ctx, s.cancel = context.WithCancel(parent)
	}

	s.schema = scratch.Name("soak")
	admin, err := s.pool(s.ctx, opts.dsn, s.appName("admin"), 3)
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.admin = admin
	if err := scratch.Create(s.ctx, admin, s.schema); err != nil {
		s.close()
		return nil, fmt.Errorf("create schema: %w", err)
	}
	if err := dedupe.Migrate(s.ctx, admin, dedupe.MigrateConfig{}); err != nil {
		s.close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if _, err := admin.Exec(s.ctx, sqlCreateEffects); err != nil {
		s.close()
		return nil, fmt.Errorf("create effects: %w", err)
	}
	s.inputs, s.unique = genInputs(opts.n, opts.dup, opts.workers, opts.seed, opts.poison, opts.keyless)
	fmt.Fprintf(stderr, "soak: seed=%d schema=%s inputs=%d unique=%d designed_to_fail=%d keyless=%d\n", opts.seed, s.schema,
		len(s.inputs), len(s.unique), countKind(s.unique, kindFails), countKind(s.unique, kindKeyless))
	return s, nil
}

// appName is the application_name of the run's connections for one role
// (a transport's consumers, or "admin"): the terminator finds its victims by
// it, and it is unique per run so concurrent soaks leave each other alone.
func (s *soak) appName(role string) string {
	return "dsoak-" + strings.TrimPrefix(s.schema, "soak_") + "-" + role
}

// pool connects to the soak's schema through dsn with application name app.
// The terminator (or the fault proxy) may kill the very first connection, so
// it tries a few times.
func (s *soak) pool(ctx context.Context, dsn, app string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(dsn, s.schema, app, maxConns)
	if err != nil {
		return nil, err
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	for try := 0; ; try++ {
		err = p.Ping(ctx)
		if err == nil {
			return p, nil
		}
		if try == 20 || ctx.Err() != nil {
			p.Close()
			return nil, fmt.Errorf("connect: %w", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// poolConfig parses dsn and sets the search_path and application_name.
func poolConfig(dsn, schema, app string, maxConns int32) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse dsn: %w", err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	return cfg, nil
}

func (s *soak) close() {
	defer s.cancel()
	if s.admin == nil {
		return
	}
	defer s.admin.Close()
	if s.opts.keep {
		s.log.Warn("soak: kept schema", "schema", s.schema)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Connections of killed subprocesses may linger a moment.
	_, _ = s.admin.Exec(ctx, sqlTerminateRun, s.appName("")+"%", s.appName("admin"))
	if err := scratch.Drop(ctx, s.admin, s.schema); err != nil {
		s.log.Error("soak: drop schema", "schema", s.schema, "err", err)
	}
}

// runTransport soaks one transport and audits it.
func (s *soak) runTransport(parent context.Context, name string) (*report, error) {
	tr, ok := lookupTransport(name)
	if !ok {
		return nil, fmt.Errorf("unknown transport %q", name)
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	f := newFaults(s.opts.seed^h.Sum64(), s.opts.rates)
	env := newEnv(s, tr, s.appName(name), f)
	env.progress = newProgress(s.admin, name)
	if proxied(s.opts) {
		p, err := startProxy(env)
		if err != nil {
			return nil, err
		}
		defer p.Close()
	}
	// The run gives up only when it stops moving for -idle.
	rctx, cancel := context.WithCancelCause(s.ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		env.progress.watch(rctx, s.opts.idle, func() { cancel(env.progress.stallError(s.opts.idle)) })
	}()
	start := time.Now()
	runErr := tr.run(rctx, env, s.inputs)
	elapsed := time.Since(start)
	if cause := context.Cause(rctx); runErr != nil && errors.Is(cause, errNoProgress) {
		runErr = fmt.Errorf("%w: %w", cause, runErr)
	}
	cancel(nil)
	<-watched
	actx, acancel := context.WithTimeout(context.WithoutCancel(parent), 2*time.Minute)
	defer acancel()
	rep, err := s.audit(actx, env)
	if err != nil {
		return nil, fmt.Errorf("audit: %w (run: %v)", err, runErr)
	}
	rep.elapsed = elapsed
	rep.faults = f
	rep.runErr = runErr
	return rep, runErr
}

// libLog is the logger handed to the library: the injected faults make it
// log errors by design, so it is silent unless -v.
func (s *soak) libLog() *slog.Logger {
	if s.opts.verbose {
		return s.log
	}
	return slog.New(slog.DiscardHandler)
}
