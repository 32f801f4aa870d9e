package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exactlyonce/dedupe/internal/scratch"
)

// workerEnv, when set, makes the soak's binary run as a worker subprocess.
const workerEnv = "DEDUPE_SOAK_WORKER"

// workerWindow is how many deliveries a worker subprocess holds at once.
const workerWindow = 4

// The worker protocol, one line each. The soak writes "<seq> <id>" to the
// worker's stdin; the worker answers on stdout "tx <seq>" from inside the
// effect's transaction, then "ack <seq>" after the commit or "nack <seq>".

// supervise runs worker subprocesses until ctx ends: run runs one until ctx
// ends (it returns false) or the soak killed it with SIGKILL inside a
// transaction (true; kills counts them, at most opts.kills), and then
// supervise starts a new one. The brokered transports' workers consume from
// the soak's broker (runWorker), the external transports' from their own
// broker or sender (runChild).
func supervise(ctx context.Context, run func(kills *int) (killed bool, err error)) error {
	kills := 0
	for ctx.Err() == nil {
		killed, err := run(&kills)
		if err != nil {
			return err
		}
		if !killed {
			return nil
		}
	}
	return nil
}

// runWorker runs one worker subprocess, fed from b, until ctx ends (it
// returns false) or the soak kills it (true); the deliveries the dead worker
// held go back to the broker.
func runWorker(ctx context.Context, e *env, b *broker, kills *int) (killed bool, err error) {
	o := e.soak.opts
	cmd, stdin, stdout, err := startWorker(e, nil)
	if err != nil {
		return false, err
	}

	var (
		mu   sync.Mutex
		held = map[int64]delivery{}
	)
	window := make(chan struct{}, workerWindow)
	fctx, stopFeeder := context.WithCancel(ctx)
	var feeder sync.WaitGroup
	feeder.Go(func() {
		defer stdin.Close()
		for {
			select {
			case window <- struct{}{}:
			case <-fctx.Done():
				return
			}
			d, ok := b.next(fctx)
			if !ok {
				return
			}
			mu.Lock()
			held[d.seq] = d
			mu.Unlock()
			if _, err := fmt.Fprintf(stdin, "%d %s\n", d.seq, d.id); err != nil {
				return // the worker died; its held deliveries are nacked below
			}
		}
	})

	settle := func(seq int64, ack bool) {
		mu.Lock()
		d, ok := held[seq]
		delete(held, seq)
		mu.Unlock()
		if !ok {
			return
		}
		<-window
		if ack {
			b.ack(d)
		} else {
			b.nack(d)
		}
	}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		verb, arg, _ := strings.Cut(sc.Text(), " ")
		seq, perr := strconv.ParseInt(arg, 10, 64)
		if perr != nil {
			continue
		}
		switch verb {
		case "tx":
			if !killed && *kills < o.kills && e.faults.hit(faultKill) {
				if cmd.Process.Kill() == nil { // SIGKILL
					*kills++
					killed = true
				}
			}
		case "ack":
			settle(seq, true)
		case "nack":
			settle(seq, false)
		}
	}
	stopFeeder()
	feeder.Wait()
	werr := cmd.Wait()
	mu.Lock()
	lost := make([]delivery, 0, len(held))
	for _, d := range held {
		lost = append(lost, d)
	}
	clear(held)
	mu.Unlock()
	for _, d := range lost {
		b.nack(d)
	}
	if !killed && werr != nil && ctx.Err() == nil {
		return false, fmt.Errorf("worker subprocess: %w", werr)
	}
	return killed, nil
}

// startWorker starts the soak's own binary as the worker subprocess of e's
// transport, with the transport flags args, and returns its pipes.
func startWorker(e *env, args []string) (*exec.Cmd, io.WriteCloser, io.ReadCloser, error) {
	o := e.soak.opts
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	cmd := exec.Command(exe, append([]string{"-database-url", e.dsn, "-schema", e.soak.schema, "-transport", e.name,
		"-app", e.app, "-lease", o.lease.String(), "-starved-lease", o.starvedLease.String(),
		"-starved-conns", strconv.Itoa(o.starvedConns), "-slow", o.slow.String(),
		"-max-attempts", strconv.Itoa(o.maxAttempts), "-poison-attempts", strconv.Itoa(o.poisonAttempts)}, args...)...)
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("start worker: %w", err)
	}
	return cmd, stdin, stdout, nil
}

// workerMain is the worker subprocess: it consumes deliveries from stdin
// with the transport's processor and reports on stdout.
func workerMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("soak-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	var schema, name, app string
	fs.StringVar(&o.dsn, "database-url", scratch.LocalDSN, "PostgreSQL connection URL")
	fs.StringVar(&o.dsn, "dsn", scratch.LocalDSN, "deprecated: the old name of -database-url, still accepted")
	fs.StringVar(&schema, "schema", "", "the soak's schema")
	fs.StringVar(&name, "transport", "handle", "the transport whose processor to run")
	fs.StringVar(&app, "app", "dedupe-soak-worker", "application_name of the connections")
	fs.DurationVar(&o.lease, "lease", 300*time.Millisecond, "lease of the leased transport")
	fs.DurationVar(&o.starvedLease, "starved-lease", 150*time.Millisecond, "lease of the starved transport")
	fs.IntVar(&o.starvedConns, "starved-conns", 2, "pool of the starved transport")
	fs.DurationVar(&o.slow, "slow", 0, "handler time of the starved transport")
	fs.IntVar(&o.maxAttempts, "max-attempts", 10, "attempt limit of the transports with inputs designed to fail")
	fs.IntVar(&o.poisonAttempts, "poison-attempts", 3, "attempt limit of the poison transport")
	var fl childFlags
	fl.register(fs)
	if err := fs.Parse(args); err != nil {
		return exitError
	}
	tr, ok := lookupTransport(name)
	if !ok || (tr.proc == nil && tr.child == nil) || schema == "" {
		fmt.Fprintf(stderr, "soak worker: bad arguments %q\n", args)
		return exitError
	}
	s := &soak{opts: o, schema: schema, log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	e := newEnv(s, tr, app, newFaults(0, [numFaults]float64{}))
	e.child = true
	if tr.child != nil {
		err := childMain(stdin, stdout, func(ctx context.Context, say func(verb, arg string)) error {
			return tr.child(ctx, e, &fl, say)
		})
		if err != nil {
			fmt.Fprintln(stderr, "soak worker:", err)
			return exitError
		}
		return exitOK
	}
	conns := e.conns
	if conns == 0 {
		conns = workerWindow
	}
	pool, err := e.consumerPool(ctx, conns)
	if err != nil {
		fmt.Fprintln(stderr, "soak worker:", err)
		return exitError
	}
	defer pool.Close()
	proc, err := tr.proc(e, pool, nil)
	if err != nil {
		fmt.Fprintln(stderr, "soak worker:", err)
		return exitError
	}

	var outMu sync.Mutex
	out := bufio.NewWriter(stdout)
	say := func(verb string, seq int64) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, "%s %d\n", verb, seq)
		_ = out.Flush()
	}
	lines := make(chan delivery)
	var wg sync.WaitGroup
	for range workerWindow {
		wg.Go(func() {
			for d := range lines {
				ok := proc.process(ctx, d, func() {
					say("tx", d.seq)
					time.Sleep(inTxPause) // the window in which the soak kills
				})
				if ok {
					say("ack", d.seq)
				} else {
					say("nack", d.seq)
				}
			}
		})
	}
	sc := bufio.NewScanner(stdin)
	var scanErr error
	for sc.Scan() {
		seqText, id, found := strings.Cut(sc.Text(), " ")
		seq, err := strconv.ParseInt(seqText, 10, 64)
		if !found || err != nil {
			scanErr = errors.New("malformed delivery line")
			break
		}
		lines <- delivery{seq: seq, id: id}
	}
	close(lines)
	wg.Wait()
	if scanErr != nil {
		fmt.Fprintln(stderr, "soak worker:", scanErr)
		return exitError
	}
	return exitOK
}
