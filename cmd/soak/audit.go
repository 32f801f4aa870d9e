package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	dedupeamqp "github.com/exactlyonce/dedupe/adapters/rabbitmq"
	deduperedis "github.com/exactlyonce/dedupe/adapters/redis"
)

// report is the audit of one transport. Every unique input must end in one
// visible state: its effect committed once, its key failed in the inbox, or a
// copy in the dead-letter destination; the inputs designed to fail in one of
// the last two, the others committed.
type report struct {
	transport    string
	inputs       int // deliveries fed to the transport, duplicates included
	unique       int
	effects      int // effect rows of the transport
	committed    int // unique inputs with an effect
	failed       int // unique inputs whose key is failed in the inbox
	deadLettered int // unique inputs with a dead-letter copy
	designed     int // unique inputs designed to fail (must not be committed)
	missing      int // unique inputs in none of the three end states
	wrongEnd     int // inputs designed to fail that committed, or others that failed or were dead-lettered
	duplicated   int // inputs with more than one effect
	unknown      int // effects, failed keys or dead letters of ids that were never an input
	refused      int // failed keys of keyless Kafka, RabbitMQ and Redis messages (dedupekafka.RefusedKey, dedupeamqp.RefusedKey, deduperedis.RefusedKey)
	stuck        int // keys in flight after every input was acknowledged
	pastLease    int // of those, with a lease that ran out

	// The poison transport: its attempt limit, the most runs of the handler
	// for one input designed to fail, the runs whose failed attempt Handle
	// could not record (the connection was lost under the record), and the
	// inputs whose recorded runs or stored attempts exceed the limit.
	attemptsAudited bool
	maxAttempts     int
	runsMax         int
	unrecorded      int
	overAttempts    int
	concurrent      int // the most calls of Handle for one such input under way at once

	// Transports that call Consumer.Handle in this process: the calls it
	// reported wrongly (committed without the effect, or not committed with
	// it), and those whose outcome it reported unknown.
	outcomesAudited bool
	misreported     int
	unknownOutcomes int

	faults  *faults
	elapsed time.Duration
	runErr  error
}

// ok reports whether every unique input ended in the one state it was
// designed for, committed ones exactly once, nothing unknown, nothing stuck
// and no attempt limit exceeded.
func (r *report) ok() bool {
	return r.missing == 0 && r.wrongEnd == 0 && r.duplicated == 0 && r.unknown == 0 && r.stuck == 0 &&
		r.overAttempts == 0 && r.misreported == 0 && r.effects == r.committed && r.runErr == nil
}

// String is the report line.
func (r *report) String() string {
	var faults int64
	detail := ""
	if r.faults != nil {
		faults, detail = r.faults.total(), " "+r.faults.String()
	}
	verdict := "ok"
	if !r.ok() {
		verdict = "MISMATCH"
	}
	attempts := ""
	if r.attemptsAudited {
		attempts = fmt.Sprintf(" max_attempts=%d runs_max=%d unrecorded_runs=%d over_attempts=%d concurrent_copies=%d",
			r.maxAttempts, r.runsMax, r.unrecorded, r.overAttempts, r.concurrent)
	}
	if r.outcomesAudited {
		attempts += fmt.Sprintf(" misreported=%d unknown_outcomes=%d", r.misreported, r.unknownOutcomes)
	}
	return fmt.Sprintf("transport=%s inputs=%d unique=%d effects=%d missing=%d duplicated=%d faults=%d "+
		"committed=%d failed=%d dead_lettered=%d designed_to_fail=%d wrong_end=%d refused=%d%s "+
		"stuck=%d expired_leases=%d unknown=%d%s elapsed=%s result=%s",
		r.transport, r.inputs, r.unique, r.effects, r.missing, r.duplicated, faults,
		r.committed, r.failed, r.deadLettered, r.designed, r.wrongEnd, r.refused, attempts,
		r.stuck, r.pastLease, r.unknown, detail, r.elapsed.Round(time.Millisecond), verdict)
}

// inboxRow is what the audit reads of one inbox key.
type inboxRow struct {
	state    string
	attempts int
}

// audit reads the effects, the inbox keys of its scope and the dead letters
// of one transport and accounts for every unique input.
func (s *soak) audit(ctx context.Context, e *env) (*report, error) {
	r := &report{transport: e.name, inputs: len(e.inputs), unique: len(s.unique)}
	counts, err := s.effectCounts(ctx, e.name)
	if err != nil {
		return nil, err
	}
	for id, n := range counts {
		r.effects += n
		switch {
		case !s.unique[id]:
			r.unknown++
		case n > 1:
			r.duplicated++
		}
	}
	keys := map[string]inboxRow{}
	if !e.inboxless {
		if keys, err = s.inboxRows(ctx, e.scope); err != nil {
			return nil, err
		}
	}
	for key, row := range keys {
		switch {
		case row.state == "in_flight":
			r.stuck++
		case row.state != "failed":
		case strings.HasPrefix(key, dedupekafka.RefusedKeyPrefix), strings.HasPrefix(key, dedupeamqp.RefusedKeyPrefix), strings.HasPrefix(key, deduperedis.RefusedKeyPrefix),
			strings.HasPrefix(key, dedupenats.RefusedKeyPrefix):
			r.refused++
		case !s.unique[key]:
			r.unknown++
		}
	}
	for id := range e.deadLettered {
		if !s.unique[id] {
			r.unknown++
		}
	}
	for id := range s.unique {
		committed, failed, dead := counts[id] > 0, keys[id].state == "failed", e.deadLettered[id]
		if committed {
			r.committed++
		}
		if failed {
			r.failed++
		}
		if dead {
			r.deadLettered++
		}
		designed := e.designedToFail(id)
		if designed {
			r.designed++
		}
		switch {
		case !committed && !failed && !dead:
			r.missing++
		case designed && committed, !designed && (failed || dead):
			r.wrongEnd++
		}
	}
	if e.attempts != nil {
		r.attemptsAudited, r.maxAttempts, r.concurrent = true, e.maxAttempts, e.attempts.maxConcurrent()
		for id := range s.unique {
			if !e.fails(id) {
				continue
			}
			runs, recorded := e.attempts.get(id)
			r.runsMax = max(r.runsMax, runs)
			r.unrecorded += runs - recorded
			if recorded > e.maxAttempts || keys[id].attempts > e.maxAttempts {
				r.overAttempts++
			}
		}
	}
	if e.outcomes != nil {
		committed, err := s.committedAttempts(ctx, e.name)
		if err != nil {
			return nil, err
		}
		r.outcomesAudited = true
		r.misreported, r.unknownOutcomes = e.outcomes.check(committed)
	}
	if e.inboxless {
		return r, nil
	}
	if err := s.admin.QueryRow(ctx, sqlStuckPastLease, e.scope).Scan(&r.pastLease); err != nil {
		return nil, err
	}
	return r, nil
}

// effectCounts returns the effects of a transport per input id.
func (s *soak) effectCounts(ctx context.Context, transport string) (map[string]int, error) {
	rows, err := s.admin.Query(ctx, sqlEffectCounts, transport)
	if err != nil {
		return nil, err
	}
	var (
		id string
		n  int
	)
	out := map[string]int{}
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		out[id] = n
		return nil
	})
	return out, err
}

// inboxRows returns the inbox keys of scope.
func (s *soak) inboxRows(ctx context.Context, scope string) (map[string]inboxRow, error) {
	rows, err := s.admin.Query(ctx, sqlInboxKeys, scope)
	if err != nil {
		return nil, err
	}
	var (
		key string
		row inboxRow
	)
	out := map[string]inboxRow{}
	_, err = pgx.ForEachRow(rows, []any{&key, &row.state, &row.attempts}, func() error {
		out[key] = row
		return nil
	})
	return out, err
}

// settledInDB reports whether every unique input that ends in the database
// did: each one not designed to fail has an effect and each one the
// transport's handler fails has its key failed. An external transport is
// finished when this holds and its broker has nothing left (inputs designed
// to fail that end dead-lettered are accounted for by the broker).
func (e *env) settledInDB(ctx context.Context) (bool, error) {
	var effects, failed int
	if err := e.soak.admin.QueryRow(ctx, sqlSettled, e.name, e.scope).Scan(&effects, &failed); err != nil {
		return false, err
	}
	wantEffects, wantFailed := 0, 0
	for id := range e.soak.unique {
		switch {
		case e.fails(id):
			wantFailed++
		case !e.designedToFail(id):
			wantEffects++
		}
	}
	return effects >= wantEffects && failed >= wantFailed, nil
}
