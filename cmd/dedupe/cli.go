package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
)

// globals are the flags every subcommand accepts, before or after its name.
type globals struct {
	databaseURL string
	schema      string
	table       string
	outboxTable string
	json        bool
	verbose     bool
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL connection `URL`. Defaults to $DATABASE_URL, else "+localURL+".")
	fs.StringVar(&g.schema, "schema", "", "`schema` of the inbox table. Defaults to the connection's search_path.")
	fs.StringVar(&g.table, "table", "", "inbox `table` name. Defaults to "+dedupe.DefaultTable+".")
	fs.StringVar(&g.outboxTable, "outbox-table", "", "transactional outbox `table` name (migrate, stats, outbox). Defaults to "+dedupe.DefaultOutboxTable+".")
	fs.BoolVar(&g.json, "json", false, "print machine-readable JSON instead of text. Defaults to false.")
	fs.BoolVar(&g.verbose, "verbose", false, "log debug details to stderr. Defaults to false.")
}

// merge returns g overridden by the flags set in o.
func (g globals) merge(o globals) globals {
	if o.databaseURL != "" {
		g.databaseURL = o.databaseURL
	}
	if o.schema != "" {
		g.schema = o.schema
	}
	if o.table != "" {
		g.table = o.table
	}
	if o.outboxTable != "" {
		g.outboxTable = o.outboxTable
	}
	g.json = g.json || o.json
	g.verbose = g.verbose || o.verbose
	return g
}

// command is one subcommand.
type command struct {
	name     string
	synopsis string // the usage line after "dedupe "
	summary  string // one line for the command list
	about    string // the paragraph of its --help
	flags    func(fs *flag.FlagSet) any
	// rawArgs: the arguments after the flags are passed on untouched (run's
	// CMD ARGS). Otherwise flags may follow positional arguments too.
	rawArgs bool
	run     func(ctx context.Context, c *cli, opts any, args []string) int
}

// commands lists the subcommands in the order "dedupe help" shows them.
func commands() []*command {
	return []*command{migrateCommand(), inspectCommand(), statsCommand(), purgeCommand(), releaseCommand(), outboxCommand(), runCommand()}
}

// cli is one invocation's environment.
type cli struct {
	stdout, stderr io.Writer
	g              globals
	log            *slog.Logger
}

// run is the whole program: it parses args (without the program name), runs
// the subcommand and returns the process exit code. main only wires it to
// os.Args, the standard streams and signals, so tests call it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &cli{stdout: stdout, stderr: stderr}
	top := flag.NewFlagSet("dedupe", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	top.Usage = func() {}
	var g globals
	g.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.mainHelp(stdout, top)
			return exitOK
		}
		fmt.Fprintf(stderr, "dedupe: %v\nRun 'dedupe --help' for usage.\n", err)
		return exitUsage
	}
	rest := top.Args()
	if len(rest) == 0 {
		c.mainHelp(stderr, top)
		return exitUsage
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		if len(rest) == 0 {
			c.mainHelp(stdout, top)
			return exitOK
		}
		name, rest = rest[0], []string{"--help"}
	}
	var cmd *command
	for _, k := range commands() {
		if k.name == name {
			cmd = k
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "dedupe: unknown command %q\nRun 'dedupe --help' for the list.\n", name)
		return exitUsage
	}

	fs := flag.NewFlagSet("dedupe "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var sub globals
	sub.register(fs)
	opts := cmd.flags(fs)
	positional, err := parseFlags(fs, rest, cmd.rawArgs)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandHelp(stdout, cmd, fs)
			return exitOK
		}
		fmt.Fprintf(stderr, "dedupe %s: %v\nRun 'dedupe %s --help' for usage.\n", cmd.name, err, cmd.name)
		return exitUsage
	}
	c.g = g.merge(sub)
	c.g.databaseURL = databaseURL(c.g.databaseURL, os.Getenv)
	level := slog.LevelWarn
	if c.g.verbose {
		level = slog.LevelDebug
	}
	c.log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	return cmd.run(ctx, c, opts, positional)
}

// parseFlags parses args into fs. Unless raw, flags may also follow
// positional arguments ("migrate status --json"); "--" ends the flags.
func parseFlags(fs *flag.FlagSet, args []string, raw bool) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if raw {
		return fs.Args(), nil
	}
	var positional []string
	for rest := fs.Args(); len(rest) > 0; rest = fs.Args() {
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		if err := fs.Parse(rest[1:]); err != nil {
			return nil, err
		}
		args = rest[1:]
	}
	return positional, nil
}

func (c *cli) mainHelp(w io.Writer, top *flag.FlagSet) {
	fmt.Fprint(w, `Usage: dedupe [global flags] <command> [flags] [args]

dedupe operates the inbox and outbox tables of github.com/exactlyonce/dedupe:
it creates them, inspects and releases keys, purges expired ones, unparks or
discards parked outbox messages, and runs shell commands at most once per key.

Commands:
`)
	for _, k := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", k.name, k.summary)
	}
	fmt.Fprint(w, "\nGlobal flags (accepted before or after the command name):\n")
	printFlags(w, top)
	fmt.Fprint(w, "\nRun 'dedupe <command> --help' for a command's flags.\n\n", exitCodes)
}

func commandHelp(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: dedupe %s\n\n%s\n\nFlags (global flags included):\n", cmd.synopsis, strings.TrimSpace(cmd.about))
	printFlags(w, fs)
	fmt.Fprint(w, "\n", exitCodes)
}

func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// fail reports err on stderr and returns its exit code.
func (c *cli) fail(cmd string, err error) int {
	msg := errText(err)
	if errors.Is(err, dedupe.ErrNotMigrated) {
		msg += "\nhint: create the table with 'dedupe migrate up' (same --schema and --table)"
	}
	fmt.Fprintf(c.stderr, "dedupe %s: %s\n", cmd, msg)
	return exitCodeFor(err)
}

// poolMaxConns bounds the CLI's connections: one for the work, one for the
// lease heartbeat of "dedupe run".
const poolMaxConns = 2

// connect opens a small pool and an Inbox over it with cfg plus the global
// schema and table. The caller closes the pool.
func (c *cli) connect(ctx context.Context, cfg dedupe.Config) (*pgxpool.Pool, *dedupe.Inbox, error) {
	pcfg, err := pgxpool.ParseConfig(c.g.databaseURL)
	if err != nil {
		// The parse error may quote the URL with its password; do not echo it.
		return nil, nil, usagef("invalid --database-url / DATABASE_URL (not shown; it may hold a password)")
	}
	pcfg.MaxConns = poolMaxConns
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		pcfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if _, ok := pcfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		pcfg.ConnConfig.RuntimeParams["application_name"] = "dedupe-cli"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, err
	}
	cfg.Schema, cfg.Table, cfg.Logger = c.g.schema, c.g.table, c.log
	inbox, err := dedupe.New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, inbox, nil
}

// requireKey validates the --scope and --key flags.
func requireKey(scope, key string) (dedupe.Key, error) {
	if scope == "" || key == "" {
		return dedupe.Key{}, usagef("--scope and --key are required")
	}
	k := dedupe.Key{Scope: scope, ID: key}
	return k, k.Validate()
}

// noArgs refuses positional arguments for commands that take none.
func noArgs(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}

// localURL is the database used when neither --database-url nor
// DATABASE_URL names one: a local server with trust authentication and a
// database named test, the fallback of every example and command of the
// repository.
const localURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// databaseURL is the URL the flag gives, else DATABASE_URL, else localURL.
func databaseURL(flagValue string, getenv func(string) string) string {
	if flagValue != "" {
		return flagValue
	}
	if u := getenv("DATABASE_URL"); u != "" {
		return u
	}
	return localURL
}
