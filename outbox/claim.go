package outbox

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// maxClaimStatements bounds the claim statements of one cycle that find
// nothing claimable before the cycle gives up (and Run looks again at once).
const maxClaimStatements = 8

// claim locks a batch in tx with sqlOutboxClaim: due heads of keys no other
// relay holds, and the later rows of those keys up to their first gap, in id
// order. Usually one statement does it. When a window of ScanWindow ids
// holds nothing claimable (a blocked backlog, or rows other relays hold),
// the cursor moves past it and the next window is tried in the same
// transaction; past the last pending row it wraps to the oldest once. A
// window that held some work stays where it is, for its keys' later rows,
// until the walk reaches the last pending row. more reports that the walk stopped with pending rows past it, so that Run
// looks again at once.
//
// The walk's first statement was sent with BEGIN (queueFirstWindow); what
// it found is first.
func (r *Relay) claim(ctx context.Context, tx dedupe.Querier, first *firstWindow) (batch []*StoredMessage, more bool, err error) {
	now, cursor := first.now, first.cursor
	wrapped := cursor == 0 // a walk from the oldest needs no wrap
	defer func() { r.cursor.Store(cursor) }()
	for n := range maxClaimStatements {
		w := first.found
		if n > 0 {
			if w, err = r.claimWindow(ctx, tx, now, cursor); err != nil {
				return nil, false, err
			}
		}
		switch {
		case w.lo == nil: // nothing pending after the cursor
			cursor = 0
			if wrapped {
				return nil, false, nil
			}
			wrapped = true
		case len(w.batch) == 0: // nothing claimable in this window: skip it
			cursor = *w.lo + int64(r.cfg.ScanWindow) - 1
			if !w.beyond {
				if wrapped {
					cursor = 0 // the next cycle starts from the oldest
					return nil, false, nil
				}
				cursor, wrapped = 0, true
			}
		default:
			for _, m := range w.batch {
				m.Attempt++ // attempts holds the failures so far
			}
			// The window was walked to its end when it yielded fewer heads
			// than a batch: rows past it may be claimable too, so look again
			// at once; past the last row, start from the oldest next time,
			// for rows before the cursor that became claimable meanwhile.
			exhausted := w.heads < r.cfg.BatchSize
			if exhausted && !w.beyond {
				cursor = 0
			}
			return w.batch, exhausted && w.beyond, nil
		}
	}
	return nil, true, nil
}

// windowFound is what one claim statement found in its window.
type windowFound struct {
	lo     *int64 // the first pending id after the cursor, nil for none
	beyond bool   // rows exist past the window (maybe published)
	heads  int
	batch  []*StoredMessage // in id order
}

// firstWindow is the walk's first claim statement, queued behind BEGIN so
// that a cycle's transaction and its claim cost one round trip: the
// database time and cursor it ran with, and what it found once the batch
// was sent.
type firstWindow struct {
	now    *time.Time
	cursor int64
	found  windowFound
}

// queueFirstWindow queues in b the claim statement of the walk's first
// window, from the relay's cursor.
func (r *Relay) queueFirstWindow(b *pgx.Batch) *firstWindow {
	f := &firstWindow{now: r.ob.dbNow(), cursor: r.cursor.Load()}
	b.Queue(r.ob.q.claim, f.now, f.cursor, r.cfg.ScanWindow, r.cfg.BatchSize).Query(func(rows pgx.Rows) (err error) {
		f.found, err = scanWindow(rows)
		return err
	})
	return f
}

// claimWindow runs sqlOutboxClaim once.
func (r *Relay) claimWindow(ctx context.Context, tx dedupe.Querier, now *time.Time, cursor int64) (windowFound, error) {
	rows, err := tx.Query(ctx, r.ob.q.claim, now, cursor, r.cfg.ScanWindow, r.cfg.BatchSize)
	if err != nil {
		return windowFound{}, translate(err)
	}
	return scanWindow(rows)
}

// scanWindow reads what one claim statement found, and closes rows.
func scanWindow(rows pgx.Rows) (c windowFound, err error) {
	defer rows.Close()
	var (
		row  outboxRow
		head *bool
	)
	dest := append([]any{&c.lo, &c.beyond, &head}, row.fields()...)
	for rows.Next() {
		row = outboxRow{}
		if err := rows.Scan(dest...); err != nil {
			return c, translate(err)
		}
		m, err := row.message()
		if err != nil {
			return c, err
		}
		if m == nil {
			continue // the row of NULLs: nothing claimed
		}
		if *head {
			c.heads++
		}
		c.batch = append(c.batch, m)
	}
	if err := rows.Err(); err != nil {
		return c, translate(err)
	}
	slices.SortFunc(c.batch, func(a, b *StoredMessage) int { return cmp.Compare(a.Seq, b.Seq) })
	return c, nil
}
