package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// external describes a transport with a broker (or a sender) of its own:
// NATS, Kafka, webhooks. The soak runs its in-process consumers, restarting
// one of them at random (a stopped consumer), and a consumer subprocess
// that it kills with SIGKILL inside a transaction and restarts, while the
// terminator kills their database connections.
type external struct {
	// consumers is how many in-process consumers run at once.
	consumers int
	// consume runs in-process consumer number n until ctx ends.
	consume func(ctx context.Context, n int) error
	// childArgs are the worker subprocess's transport flags (nil: no child).
	childArgs []string
	// onChildLine receives the child's lines other than "tx" (e.g. its
	// listening address).
	onChildLine func(verb, arg string)
	// feed delivers the inputs (publishes them, or sends them and retries
	// until each was accepted); it may return before they are processed.
	feed func(ctx context.Context) error
	// done reports whether every input was processed and acknowledged.
	done func(ctx context.Context) (bool, error)
}

// runExternal runs x until done reports true or ctx ends.
func runExternal(ctx context.Context, e *env, x external) error {
	o := e.soak.opts
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		wg     sync.WaitGroup
		errMu  sync.Mutex
		errs   []error
		record = func(err error) {
			if err != nil && wctx.Err() == nil {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
				stop()
			}
		}
	)
	for n := range x.consumers {
		wg.Go(func() {
			record(restarting(wctx, e, n == 0, func(ctx context.Context) error { return x.consume(ctx, n) }))
		})
	}
	if x.childArgs != nil && o.kills > 0 {
		wg.Go(func() {
			record(supervise(wctx, func(kills *int) (bool, error) { return runChild(wctx, e, x.childArgs, kills, x.onChildLine) }))
		})
	}
	wg.Go(func() { terminator(wctx, e, o.terminate) })
	wg.Go(func() { record(x.feed(wctx)) })

	var doneErr error
	tick := time.NewTicker(50 * time.Millisecond)
	for finished := false; !finished; {
		select {
		case <-wctx.Done():
			doneErr = wctx.Err()
			finished = true
		case <-tick.C:
			ok, err := x.done(wctx)
			if err == nil && ok {
				finished = true
			}
		}
	}
	tick.Stop()
	stop()
	wg.Wait()
	errMu.Lock()
	defer errMu.Unlock()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if doneErr != nil {
		return fmt.Errorf("not every input was processed: %w", doneErr)
	}
	return nil
}

// restarting runs consume until ctx ends; when restart is set it stops the
// consumer (cancels it and waits) after about -restart-every more committed
// effects (at random between half and one and a half times that) and starts
// it again, each stop a fault.
func restarting(ctx context.Context, e *env, restart bool, consume func(context.Context) error) error {
	every := e.soak.opts.restart
	for ctx.Err() == nil {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- consume(cctx) }()
		var timer chan struct{}
		if restart && every > 0 {
			timer = make(chan struct{})
			target := e.progress.effectsNow() + int64(every/2+e.faults.intn(every)+1)
			go func() {
				if e.progress.waitEffects(cctx, target) {
					close(timer)
				}
			}()
		}
		select {
		case err := <-done:
			cancel()
			if ctx.Err() == nil && err != nil {
				return err
			}
			if ctx.Err() == nil {
				return errors.New("consumer returned before it was stopped")
			}
			return nil
		case <-timer:
			cancel()
			if err := <-done; err != nil {
				return fmt.Errorf("stopped consumer: %w", err)
			}
			e.faults.add(faultStop)
		case <-ctx.Done():
			cancel()
			return <-done
		}
	}
	return nil
}

// runChild runs the worker subprocess with args until ctx ends (false) or
// the soak kills it with SIGKILL (true), which it does when the child reports
// "tx" (it is inside a transaction) and the kill fault fires.
func runChild(ctx context.Context, e *env, args []string, kills *int, onLine func(verb, arg string)) (killed bool, err error) {
	o := e.soak.opts
	cmd, stdin, stdout, err := startWorker(e, args)
	if err != nil {
		return false, err
	}
	// Closing stdin asks the child to stop cleanly.
	stopped := context.AfterFunc(ctx, func() { _ = stdin.Close() })
	defer stopped()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		verb, arg, _ := strings.Cut(sc.Text(), " ")
		if verb != "tx" {
			if onLine != nil {
				onLine(verb, arg)
			}
			continue
		}
		if !killed && *kills < o.kills && e.faults.hit(faultKill) {
			if cmd.Process.Kill() == nil {
				*kills++
				killed = true
			}
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	werr := cmd.Wait()
	_ = stdin.Close()
	if !killed && werr != nil && ctx.Err() == nil {
		return false, fmt.Errorf("worker subprocess: %w", werr)
	}
	return killed, nil
}

// childMain is the part of a worker subprocess common to the external
// transports: it runs consume until stdin closes (the soak stops it) and
// gives consume a function that reports "tx <id>" and lingers a moment, the
// window in which the soak kills it.
func childMain(stdin io.Reader, stdout io.Writer, consume func(ctx context.Context, say func(verb, arg string)) error) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		cancel()
	}()
	var mu sync.Mutex
	out := bufio.NewWriter(stdout)
	say := func(verb, arg string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "%s %s\n", verb, arg)
		_ = out.Flush()
	}
	return consume(ctx, say)
}

// inTxPause is how long a child's handler lingers after reporting "tx".
const inTxPause = 2 * time.Millisecond
