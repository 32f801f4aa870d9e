package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// faultKind is one kind of injected fault.
type faultKind int

// The faults the soak injects.
const (
	faultError      faultKind = iota // the handler returns an error after writing its effect
	faultPanic                       // the handler panics after writing its effect
	faultTerminate                   // pg_terminate_backend on one of the consumer's connections
	faultKill                        // SIGKILL of the worker subprocess inside a transaction
	faultRedeliver                   // the broker delivers an acknowledged message again
	faultAbandon                     // a leased holder dies: its lease must expire and be taken over
	faultLate                        // a leased holder outlives its lease and completes late
	faultStop                        // a consumer is stopped and started again
	faultCommitLost                  // the proxy dropped a COMMIT's reply after the server applied it
	faultReplyLost                   // the proxy dropped another statement's reply after the server applied it
	faultCut                         // the proxy cut a connection before a statement reached the server
	faultFenced                      // a leased holder whose lease ran out was refused (ErrLeaseLost)
	faultStarved                     // a consumer waited for a connection of its exhausted pool
	faultBrokerCut                   // the broker connections of the in-process consumers were cut
	numFaults
)

var faultNames = [numFaults]string{"errors", "panics", "terminated", "killed", "redelivered", "abandoned", "late", "stopped",
	"commit_lost", "reply_lost", "cut", "fenced", "starved", "broker_cut"}

// rateFlags are the faults injected at a rate given by a flag, and the flag.
var rateFlags = map[faultKind]string{
	faultError: "error-rate", faultPanic: "panic-rate", faultRedeliver: "redeliver-rate", faultKill: "kill-rate",
	faultAbandon: "abandon-rate", faultLate: "late-rate",
	faultCommitLost: "drop-commit-rate", faultReplyLost: "drop-reply-rate", faultCut: "cut-rate",
}

// errInjected is the error a faulty handler returns.
var errInjected = errors.New("soak: injected handler failure")

// faults decides at random which faults fire and counts those that did. A
// fault whose rate is set fires at the latest at its 1/rate-th chance, so
// that every configured fault occurs in a run long enough to expect it,
// whatever the scheduling did with the random draws (a test that requires
// each fault to have fired then holds on any machine).
type faults struct {
	mu     sync.Mutex
	rng    *rand.Rand
	rates  [numFaults]float64
	chance [numFaults]int64 // chances given so far, under mu
	count  [numFaults]atomic.Int64
}

func newFaults(seed uint64, rates [numFaults]float64) *faults {
	return &faults{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), rates: rates}
}

// hit reports whether fault k fires now, and counts it when it does.
func (f *faults) hit(k faultKind) bool {
	f.mu.Lock()
	fire := false
	if r := f.rates[k]; r > 0 {
		f.chance[k]++
		fire = f.rng.Float64() < r || f.count[k].Load() == 0 && float64(f.chance[k]) >= 1/r
	}
	f.mu.Unlock()
	if fire {
		f.count[k].Add(1)
	}
	return fire
}

// intn returns a random int in [0, n).
func (f *faults) intn(n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.IntN(n)
}

// add counts a fault that fired outside hit.
func (f *faults) add(k faultKind) { f.count[k].Add(1) }

// total is the number of faults that fired.
func (f *faults) total() int64 {
	var n int64
	for k := range numFaults {
		n += f.count[k].Load()
	}
	return n
}

// String lists the faults that fired by kind, as key=value pairs.
func (f *faults) String() string {
	var parts []string
	for k := range numFaults {
		parts = append(parts, fmt.Sprintf("%s=%d", faultNames[k], f.count[k].Load()))
	}
	return strings.Join(parts, " ")
}

// terminator kills one of the consumers' server connections, found by their
// application_name, every `every` effects the transport commits, until ctx
// ends: paced by progress, so that a slow machine suffers as many
// terminations per message as a fast one.
func terminator(ctx context.Context, e *env, every int) {
	if every <= 0 {
		return
	}
	admin, appName, f, log := e.soak.admin, e.app, e.faults, e.soak.log
	for next := e.progress.effectsNow() + int64(every); ; next += int64(every) {
		if !e.progress.waitEffects(ctx, next) {
			return
		}
		rows, err := admin.Query(ctx, sqlBackends, appName)
		if err != nil {
			continue
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil || len(pids) == 0 {
			continue
		}
		pid := pids[f.intn(len(pids))]
		var ok bool
		if err := admin.QueryRow(ctx, sqlTerminate, pid).Scan(&ok); err == nil && ok {
			f.add(faultTerminate)
			log.Debug("soak: terminated backend", "pid", pid, "app", appName)
		}
	}
}
