// Command pgcontainer starts a PostgreSQL container with testcontainers for
// the tests, when neither DATABASE_URL nor a server on 127.0.0.1:5432
// answers and a Docker engine runs. It prints the connection string on its
// first line and keeps the container until its standard input closes (the
// test process that started it ended), then stops it.
//
// It is its own module so that testcontainers and the Docker client stay out
// of the core module's dependencies: internal/dbtest runs it with `go run`.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgcontainer:", err)
		os.Exit(1)
	}
}

func run() (err error) {
	defer func() {
		// testcontainers panics in some setups without Docker; report it.
		if v := recover(); v != nil {
			err = fmt.Errorf("testcontainers: %v", v)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
		tcpostgres.WithDatabase("test"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		cancel()
		return err
	}
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	cancel()
	if err != nil {
		return err
	}
	fmt.Println(u)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test process ends
	stop, cancelStop := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelStop()
	return c.Terminate(stop)
}
