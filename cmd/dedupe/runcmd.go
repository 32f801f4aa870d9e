package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/exactlyonce/dedupe"
)

// What "dedupe run" does with the key when the command exits non-zero.
const (
	onFailureRelease  = "release"  // Fail: a retry may run it again
	onFailureComplete = "complete" // store the status; never run again
	onFailurePoison   = "poison"   // mark the key failed until an operator releases it
)

// Defaults of the run flags.
const (
	defaultRunTail      = 4096
	maxRunTail          = 1 << 20
	defaultKillAfter    = 10 * time.Second
	lastErrorTail       = 512
	recordRetryInterval = 250 * time.Millisecond
	recordTimeout       = 5 * time.Second
)

// runFlags are the flags of run.
type runFlags struct {
	keyFlags
	lease, heartbeat, killAfter, retention time.Duration
	maxAttempts                            int
	onFailure                              string
	tail                                   int
	fingerprint                            bool
	contain                                string
}

func runCommand() *command {
	return &command{
		name:     "run",
		synopsis: "run --scope S --key K [flags] -- CMD [ARGS...]",
		summary:  "run a command at most once per key, under a lease (for scheduler tasks)",
		about: `run executes CMD at most once per (scope, key), for shell tasks started by
schedulers that retry (Airflow, cron, Kubernetes Jobs). It claims the key in
leased mode, renews the lease every --heartbeat while CMD runs, and when CMD
ends stores its exit status and the last --tail bytes of its output with the
key (see "dedupe inspect"). CMD's stdout and stderr pass through; its stdin is
empty.

  - The key is complete: CMD is not run; run exits 0 (or, for a key completed
    with --on-failure=complete, with the stored status).
  - Another run holds a live lease: CMD is not run; exit 75. Retry later.
  - CMD exits non-zero: by default the key is released at once so that a
    retry may run CMD again (--on-failure=release; after --max-attempts
    failures the key is marked failed); --on-failure=complete stores the
    status as final; --on-failure=poison marks the key failed (exit 76 for
    later runs until "dedupe release"). run exits with CMD's status.
  - dedupe is killed (SIGKILL included): on Linux every process of the job
    dies with it (see Containment); the lease expires after --lease and a
    later run takes the key over.
  - dedupe gets SIGINT or SIGTERM: it sends SIGTERM to CMD's process group,
    SIGKILL to the whole job after --kill-after, and releases the key once no
    process of the job is left.
  - The lease is lost while CMD runs (an operator released the key, or the
    database was unreachable until the lease was about to run out): the whole
    job is killed at once (no --kill-after grace) and run exits 125, since
    another run may now take the key over.
  - CMD exits: whatever it left running (background processes, daemons) is
    killed before the outcome is recorded. The job is CMD and all it started.

Containment (Linux). CMD runs under a small supervisor, dedupe itself run
again, so that no process of the job outlives dedupe however dedupe dies:
  - pidns: the supervisor is the init of a new PID namespace. The kernel
    kills every process of a namespace when its init dies, and no process
    can leave it (setsid, double forks, daemons). The supervisor dies with
    dedupe (parent-death signal SIGKILL, and a pipe only dedupe holds open).
    Needs CAP_SYS_ADMIN (root), or unprivileged user namespaces: with
    --contain=pidns an unprivileged dedupe makes one, where CMD keeps its
    uid but setuid programs (sudo) cannot gain privileges.
  - subreaper: the supervisor is the job's child subreaper; when dedupe
    dies it kills every descendant (through /proc) before it exits. This
    holds however dedupe dies, but not if the supervisor itself is
    SIGKILLed on its own while dedupe lives.
--contain=auto (the default) uses pidns where permitted (root) and else
subreaper; --contain=pidns refuses to run CMD without a namespace.
Other systems: CMD is run directly, with no containment. If dedupe is
killed there, CMD and what it started run on, and a later run may take the
key over once the lease expires while they still run: keep --lease longer
than CMD can run, or make CMD's effects idempotent themselves.

CMD sees DEDUPE_SCOPE, DEDUPE_KEY, DEDUPE_ATTEMPT and DEDUPE_IDEMPOTENCY_KEY,
a UUID derived from the scope and key that every retry shares: send it as the
Idempotency-Key of the external calls CMD makes.

The key must name the logical run, never the attempt: for Airflow use
dag_id/task_id/run_id, never try_number. With --fingerprint (the default) the
command line is hashed and stored with the key, and the same key with another
command line is refused (exit 77).

With --json, run's own report is one JSON object on stderr (stdout is CMD's).`,
		flags: func(fs *flag.FlagSet) any {
			f := &runFlags{}
			f.register(fs)
			fs.DurationVar(&f.lease, "lease", dedupe.DefaultLease, "how long the claim is held without renewal; a dead run's key is taken over after it.")
			fs.DurationVar(&f.heartbeat, "heartbeat", 0, "how often the lease is renewed while CMD runs. Defaults to a third of --lease.")
			fs.DurationVar(&f.killAfter, "kill-after", defaultKillAfter, "how long CMD may take to exit after SIGTERM before SIGKILL.")
			fs.DurationVar(&f.retention, "retention", dedupe.DefaultRetention, "how long the key is kept after its last write (then 'dedupe purge' may delete it and a later run would run again).")
			fs.IntVar(&f.maxAttempts, "max-attempts", dedupe.DefaultMaxAttempts, "failed runs before the key is marked failed; negative for no limit.")
			fs.StringVar(&f.onFailure, "on-failure", onFailureRelease, "what a non-zero exit does to the key: release, complete or poison.")
			fs.IntVar(&f.tail, "tail", defaultRunTail, "`bytes` of CMD's output (stdout and stderr, interleaved) stored with the key.")
			fs.BoolVar(&f.fingerprint, "fingerprint", true, "store a hash of CMD and ARGS with the key and refuse the key with another command.")
			fs.StringVar(&f.contain, "contain", containAuto, containHelp)
			return f
		},
		rawArgs: true,
		run:     runRun,
	}
}

// runReport is what "dedupe run" reports about itself when it ends.
type runReport struct {
	Scope   string `json:"scope"`
	Key     string `json:"key"`
	Outcome string `json:"outcome"` // ran, skipped, in_flight, poisoned, conflict, lease_lost, error
	Attempt int    `json:"attempt,omitempty"`
	// Status is CMD's exit status (ran) or the stored one (skipped).
	Status      *int     `json:"status,omitempty"`
	Recorded    string   `json:"recorded,omitempty"` // complete, released, failed
	LockedUntil jsonTime `json:"locked_until"`
	Seconds     float64  `json:"seconds,omitempty"`
	Error       string   `json:"error,omitempty"`
	Exit        int      `json:"exit"`
}

func (f *runFlags) validate(argv []string) error {
	switch {
	case len(argv) == 0:
		return usagef("no command: dedupe run --scope S --key K -- CMD [ARGS...]")
	case f.lease <= 0:
		return usagef("--lease must be positive")
	case f.heartbeat < 0 || f.heartbeat >= f.lease:
		return usagef("--heartbeat must be positive and shorter than --lease")
	case f.killAfter <= 0:
		return usagef("--kill-after must be positive")
	case f.retention < f.lease:
		return usagef("--retention must be at least --lease")
	case f.maxAttempts == 0:
		return usagef("--max-attempts must not be 0 (negative means no limit)")
	case f.tail < 0 || f.tail > maxRunTail:
		return usagef("--tail must be between 0 and %d", maxRunTail)
	}
	switch f.onFailure {
	case onFailureRelease, onFailureComplete, onFailurePoison:
	default:
		return usagef("--on-failure must be release, complete or poison, not %q", f.onFailure)
	}
	switch f.contain {
	case containAuto, containPIDNS, containSubreaper:
	default:
		return usagef("--contain must be auto, pidns or subreaper, not %q", f.contain)
	}
	return nil
}

func runRun(ctx context.Context, c *cli, opts any, argv []string) int {
	f := opts.(*runFlags)
	key, err := requireKey(f.scope, f.key)
	if err == nil {
		err = f.validate(argv)
	}
	if err != nil {
		return c.fail("run", err)
	}
	if f.heartbeat == 0 {
		f.heartbeat = f.lease / 3
	}
	if f.fingerprint {
		key.Fingerprint = commandFingerprint(argv)
	}
	rep := &runReport{Scope: key.Scope, Key: key.ID}
	pool, inbox, err := c.connect(ctx, dedupe.Config{Lease: f.lease, Retention: f.retention, MaxAttempts: f.maxAttempts})
	if err != nil {
		if exitCodeFor(err) == exitUsage {
			return c.fail("run", err)
		}
		return c.endRun(rep, "error", exitRunFailed, err)
	}
	defer pool.Close()

	claim, err := inbox.Begin(ctx, key)
	if err != nil {
		return c.endRun(rep, "error", exitRunFailed, err)
	}
	rep.Attempt = claim.Attempt
	rep.LockedUntil = jsonTime{claim.LockedUntil}
	switch claim.Outcome {
	case dedupe.OutcomeClaimed:
	case dedupe.OutcomeDuplicate:
		status := claim.Result.Status
		rep.Status = &status
		code := exitOK
		if status > 0 && status < 256 {
			code = status
		}
		return c.endRun(rep, "skipped", code, nil)
	case dedupe.OutcomeInFlight:
		return c.endRun(rep, "in_flight", exitInFlight, fmt.Errorf("%w: %s is held by another run until %s",
			dedupe.ErrInFlight, key, claim.LockedUntil.UTC().Format(time.RFC3339)))
	case dedupe.OutcomeConflict:
		return c.endRun(rep, "conflict", exitConflict, fmt.Errorf("%w: %s was used with a different command", dedupe.ErrConflict, key))
	case dedupe.OutcomePoisoned:
		return c.endRun(rep, "poisoned", exitPoisoned, fmt.Errorf("%w: %s (after %d attempts); 'dedupe release' it to allow another run",
			dedupe.ErrPoisoned, key, claim.Attempt))
	default:
		return c.endRun(rep, "error", exitRunFailed, fmt.Errorf("unexpected outcome %v", claim.Outcome))
	}
	r := &runner{c: c, f: f, inbox: inbox, claim: claim, argv: argv, rep: rep}
	return r.run(ctx)
}

// runner runs one claimed command.
type runner struct {
	c     *cli
	f     *runFlags
	inbox *dedupe.Inbox
	claim *dedupe.Claim
	argv  []string
	rep   *runReport
	// containMode is how the job is contained ("" for not at all).
	containMode string
}

func (r *runner) run(ctx context.Context) int {
	tail := newTailBuffer(r.f.tail)
	cmd := exec.Command(r.argv[0], r.argv[1:]...)
	cmd.Env = append(os.Environ(),
		"DEDUPE_SCOPE="+r.claim.Key.Scope,
		"DEDUPE_KEY="+r.claim.Key.ID,
		"DEDUPE_ATTEMPT="+strconv.Itoa(r.claim.Attempt),
		"DEDUPE_IDEMPOTENCY_KEY="+r.claim.DerivedKey("run"),
	)
	cmd.Stdout = io.MultiWriter(r.c.stdout, tail)
	cmd.Stderr = io.MultiWriter(r.c.stderr, tail)
	// A background process that keeps the output open must not hold run
	// forever after the command itself exited.
	cmd.WaitDelay = r.f.killAfter
	started := time.Now()
	// The heartbeat starts before the command (starting it may take a while
	// on a loaded machine) and outlives an interruption of dedupe: the lease
	// must hold until the command has really stopped.
	hbCtx, cancelHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
	hb := r.inbox.KeepAlive(hbCtx, r.claim, r.f.heartbeat)
	ch, err := startChild(cmd, r.f.contain)
	if err != nil {
		cancelHeartbeat()
		_ = hb.Stop()
		r.claim.LockedUntil = hb.LockedUntil()
		// Release the key: fixing the PATH and retrying must be possible.
		r.failKey(ctx, fmt.Errorf("start %s: %w", r.argv[0], err), false)
		return r.c.endRun(r.rep, "error", startErrorCode(err), fmt.Errorf("start %s: %w", r.argv[0], err))
	}
	defer ch.release()
	r.c.log.Debug("dedupe run: command started", "key", r.claim.Key.String(), "contain", containedBy(ch.mode))
	r.containMode = ch.mode

	var (
		lostErr     error
		interrupted bool
		stopping    <-chan time.Time
		doneCtx     = ctx.Done()
		lost        = hb.Lost()
	)
	stop := func() {
		if stopping == nil {
			ch.terminate()
			stopping = time.After(r.f.killAfter)
		}
	}
	// A lost lease kills the job at once, without --kill-after's grace:
	// another run may take the key over now, and must not overlap it.
	leaseLost := func(err error) {
		if lostErr == nil {
			lostErr = err
			r.c.log.Error("dedupe run: lease lost; killing the command", "key", r.claim.Key.String(), "err", err)
			ch.kill()
			stopping = make(chan time.Time) // never: killed already
		}
	}
wait:
	for {
		select {
		case <-ch.done:
			break wait
		case <-doneCtx:
			doneCtx = nil
			interrupted = true
			r.c.log.Warn("dedupe run: interrupted; stopping the command", "key", r.claim.Key.String())
			stop()
		case <-lost:
			lost = nil
			leaseLost(hb.Stop())
		case <-stopping:
			ch.kill()
			stopping = make(chan time.Time) // never again
		}
	}
	// Cancel first: a renewal hanging on an unreachable database must not
	// hold the outcome back.
	cancelHeartbeat()
	if err := hb.Stop(); lostErr == nil {
		lostErr = err
	}
	r.claim.LockedUntil = hb.LockedUntil()
	status := exitStatus(ch.cmd.ProcessState)
	duration := time.Since(started)
	r.rep.Status = &status
	r.rep.Seconds = duration.Seconds()
	r.rep.LockedUntil = jsonTime{r.claim.LockedUntil}

	result := dedupe.Result{Status: status, Headers: r.resultHeaders(ch.cmd, started, duration, tail), Body: tail.Bytes()}
	if status == 0 || (r.f.onFailure == onFailureComplete && !interrupted && lostErr == nil) {
		// Complete is fenced by the claim's token: even after the heartbeat
		// gave up, it succeeds only if no other run took the key over.
		err := r.record(ctx, func(ctx context.Context) error { return r.inbox.Complete(ctx, r.claim, result) })
		switch {
		case err == nil:
			r.rep.Recorded = "complete"
			return r.c.endRun(r.rep, "ran", status, nil)
		case lostErr != nil || errors.Is(err, dedupe.ErrLeaseLost):
			return r.c.endRun(r.rep, "lease_lost", exitRunFailed, fmt.Errorf("the command exited %d but the lease was lost "+
				"before its completion was recorded; another run may run it again: %w", status, errors.Join(lostErr, err)))
		}
		return r.c.endRun(r.rep, "error", exitRunFailed, fmt.Errorf("the command exited %d but its completion was not recorded "+
			"(a later run will run it again once the lease expires): %w", status, err))
	}
	if lostErr != nil {
		return r.c.endRun(r.rep, "lease_lost", exitRunFailed, fmt.Errorf("the command was stopped (status %d) because the lease was lost; "+
			"another run may take the key over: %w", status, lostErr))
	}
	cause := fmt.Errorf("exit status %d", status)
	if out := lastLines(result.Body, lastErrorTail); out != "" {
		cause = fmt.Errorf("exit status %d: %s", status, out)
	}
	r.failKey(ctx, cause, r.f.onFailure == onFailurePoison && !interrupted)
	return r.c.endRun(r.rep, "ran", status, nil)
}

// failKey records a failed attempt and lets a retry take the key (or marks
// it failed when permanent or out of attempts).
func (r *runner) failKey(ctx context.Context, cause error, permanent bool) {
	if permanent {
		cause = dedupe.Permanent(cause)
	}
	var poisoned bool
	err := r.record(ctx, func(ctx context.Context) error {
		var err error
		poisoned, err = r.inbox.Fail(ctx, r.claim, cause)
		return err
	})
	switch {
	case err != nil:
		r.c.log.Error("dedupe run: could not release the key; a retry may take it over once the lease expires",
			"key", r.claim.Key.String(), "until", r.claim.LockedUntil, "err", err)
		r.rep.Error = err.Error()
	case poisoned:
		r.rep.Recorded = "failed"
	default:
		r.rep.Recorded = "released"
	}
}

// record runs op (Complete or Fail) until it succeeds, is refused, or the
// lease is about to run out; it is not cut short by an interruption, so that
// the outcome of a command that did finish is kept.
func (r *runner) record(ctx context.Context, op func(ctx context.Context) error) error {
	for {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		err := op(cctx)
		cancel()
		if err == nil || errors.Is(err, dedupe.ErrLeaseLost) || time.Until(r.claim.LockedUntil) < recordRetryInterval {
			return err
		}
		r.c.log.Warn("dedupe run: recording the outcome failed; retrying", "key", r.claim.Key.String(), "err", err)
		time.Sleep(recordRetryInterval)
	}
}

// resultHeaders describe the run for "dedupe inspect"; cmd is the started
// process (the job's supervisor on Linux).
func (r *runner) resultHeaders(cmd *exec.Cmd, started time.Time, d time.Duration, tail *tailBuffer) map[string][]string {
	h := map[string][]string{
		"Command":      {r.argv[0]},
		"Started":      {started.UTC().Format(time.RFC3339Nano)},
		"Duration":     {d.Round(time.Millisecond).String()},
		"Output-Bytes": {strconv.FormatInt(tail.Total(), 10)},
		"Pid":          {strconv.Itoa(cmd.Process.Pid)},
		"Contain":      {containedBy(r.containMode)},
	}
	if host, err := os.Hostname(); err == nil {
		h["Host"] = []string{host}
	}
	return h
}

// recordedText says for people what a run left in its key (runReport.Recorded).
var recordedText = map[string]string{
	"complete": "complete",
	"released": "released for a retry (in_flight with no holder: the next run takes it over)",
	"failed":   "marked failed ('dedupe release' it to allow another run)",
	"":         "not recorded",
}

// endRun prints the run's report on stderr and returns code.
func (c *cli) endRun(rep *runReport, outcome string, code int, err error) int {
	rep.Outcome, rep.Exit = outcome, code
	if err != nil {
		rep.Error = err.Error()
		if errors.Is(err, dedupe.ErrNotMigrated) {
			rep.Error += " (create the table with 'dedupe migrate up', same --schema and --table)"
		}
	}
	if c.g.json {
		// One line, so that log scrapers and tests find it after CMD's output.
		if err := json.NewEncoder(c.stderr).Encode(rep); err != nil {
			fmt.Fprintf(c.stderr, "dedupe run: encode report: %v\n", err)
		}
		return code
	}
	key := rep.Scope + "/" + rep.Key
	switch {
	case err != nil:
		fmt.Fprintf(c.stderr, "dedupe run: %s\n", errText(errors.New(rep.Error)))
	case outcome == "skipped":
		fmt.Fprintf(c.stderr, "dedupe run: %s is already complete (status %d); not running it again\n", key, *rep.Status)
	default:
		fmt.Fprintf(c.stderr, "dedupe run: %s attempt %d exited %d in %s; key %s\n", key, rep.Attempt, *rep.Status,
			time.Duration(rep.Seconds*float64(time.Second)).Round(time.Millisecond), recordedText[rep.Recorded])
		if rep.Error != "" {
			fmt.Fprintf(c.stderr, "dedupe run: recording failed: %s\n", rep.Error)
		}
	}
	return code
}

// commandFingerprint hashes the command line, each argument length-prefixed
// so that ["a b"] and ["a", "b"] differ.
func commandFingerprint(argv []string) []byte {
	h := sha256.New()
	var n [8]byte
	for _, a := range argv {
		binary.BigEndian.PutUint64(n[:], uint64(len(a)))
		h.Write(n[:])
		h.Write([]byte(a))
	}
	return h.Sum(nil)
}

// lastLines returns at most max bytes from the end of b, for the key's last
// error.
func lastLines(b []byte, max int) string {
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// containedBy names a containment mode for logs and inspect.
func containedBy(mode string) string {
	if mode == "" {
		return "none"
	}
	return mode
}
