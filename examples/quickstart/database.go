package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// localURL is tried when DATABASE_URL is not set.
const localURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

const howToProvide = `the quickstart needs PostgreSQL. Provide one of:
  - DATABASE_URL=postgres://user:pass@host:5432/db  (a user that may CREATE SCHEMA)
  - a server on 127.0.0.1:5432 with database "test" and trust auth for user postgres
  - a running Docker engine, so that a postgres:16-alpine container can be started`

// findDatabase returns a PostgreSQL URL: DATABASE_URL, else localURL, else a
// container started with testcontainers. cleanup stops the container, if
// one was started.
func findDatabase(ctx context.Context) (url, source string, cleanup func(), err error) {
	noop := func() {}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		if err := ping(ctx, u); err != nil {
			return "", "", noop, fmt.Errorf("DATABASE_URL does not answer: %w\n%s", err, howToProvide)
		}
		return u, "DATABASE_URL", noop, nil
	}
	localErr := ping(ctx, localURL)
	if localErr == nil {
		return localURL, "127.0.0.1:5432", noop, nil
	}
	u, cleanup, cerr := startContainer(ctx)
	if cerr == nil {
		return u, "a testcontainers postgres:16-alpine", cleanup, nil
	}
	return "", "", noop, fmt.Errorf("%s\ntried:\n  %s: %v\n  testcontainers: %v", howToProvide, localURL, localErr, cerr)
}

func ping(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

func startContainer(ctx context.Context) (u string, cleanup func(), err error) {
	defer func() {
		// testcontainers may panic where no Docker engine is configured.
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
		tcpostgres.WithDatabase("test"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		if c != nil {
			_ = c.Terminate(context.WithoutCancel(ctx))
		}
		return "", nil, err
	}
	u, err = c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = c.Terminate(context.WithoutCancel(ctx))
		return "", nil, err
	}
	return u, func() {
		if err := c.Terminate(context.Background()); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintf(os.Stderr, "quickstart: stop container: %v\n", err)
		}
	}, nil
}
