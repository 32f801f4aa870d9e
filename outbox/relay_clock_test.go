package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/exactlyonce/dedupe/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestRelayDecisionsIgnoreASkewedApplicationClock runs a relay whose
// process clock is years off the database's: inside a synctest bubble,
// time.Now starts at 2000-01-01 (behind) or is moved to 2031 (ahead), while
// PostgreSQL keeps the real time. With Config.Clock unset, every decision of
// the outbox and relay follows the database: a retry comes due when the
// database's clock passes it (here only the database's time moves: pg_sleep),
// the lag and the oldest pending age are the database's, retention keeps
// fresh rows, and a message enqueued by the skewed process is due at once
// for a relay elsewhere.
func TestRelayDecisionsIgnoreASkewedApplicationClock(t *testing.T) {
	t.Parallel()
	const retryAfter = 2 * time.Second
	for name, appNow := range map[string]time.Time{
		"behind": {}, // the bubble's own epoch, 2000-01-01
		"ahead":  time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupOutbox(t)
			ctx := context.Background()
			writer, _ := outbox.New(b.db.Pool, outbox.Config{}) // a process with a good clock
			b.outbox = writer
			ids := b.enqueue(t, outbox.Message{Topic: "t", Key: "a", Payload: []byte("retry")},
				outbox.Message{Topic: "t", Payload: []byte("first")})
			var skewedID string
			synctest.Test(t, func(t *testing.T) {
				if !appNow.IsZero() {
					time.Sleep(time.Until(appNow))
				}
				pool, err := pgxpool.New(ctx, b.db.URL)
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				// The test's pool lives outside the bubble: use this one here.
				count := func(sql string, args ...any) (n int) {
					if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
						t.Fatal(err)
					}
					return n
				}
				ob, err := outbox.New(pool, outbox.Config{})
				if err != nil {
					t.Fatal(err)
				}
				rec := newRecorder()
				var failOnce sync.Once
				rec.setFail(func(m *outbox.StoredMessage) (err error) {
					if m.ID == ids[0] {
						failOnce.Do(func() { err = errors.New("refused once") })
					}
					return err
				})
				var (
					mu   sync.Mutex
					lags []time.Duration
				)
				relay, err := outbox.NewRelay(ob, rec, outbox.RelayConfig{DisableListen: true, MinBackoff: retryAfter,
					MaxBackoff: retryAfter, Retention: time.Hour, Logger: testLogger(t),
					Observer: relayHooks{Published: func(_ *outbox.StoredMessage, lag time.Duration) {
						mu.Lock()
						lags = append(lags, lag)
						mu.Unlock()
					}}})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("application clock %v", time.Now())
				if n, err := relay.Cycle(ctx); n != 1 || err != nil {
					t.Fatalf("first cycle = %d, %v; want the unkeyed message published, the other failed", n, err)
				}
				// The retry is due retryAfter (less up to 20% jitter) after the
				// failure on the database's clock, whatever the application's
				// says; long enough that the count and the next cycle run
				// before it on a loaded machine.
				if n := count(`SELECT count(*) FROM dedupe_outbox WHERE message_id = $1 AND attempts = 1
					AND next_attempt_at BETWEEN clock_timestamp() AND clock_timestamp() + $2::interval`, ids[0], retryAfter.String()); n != 1 {
					t.Fatal("the retry is not scheduled on the database's clock")
				}
				if n, err := relay.Cycle(ctx); n != 0 || err != nil {
					t.Fatalf("cycle before the retry is due = %d, %v", n, err)
				}
				count("SELECT count(*) FROM pg_sleep($1)", (retryAfter + 100*time.Millisecond).Seconds()) // only the database's time moves
				if n, err := relay.Cycle(ctx); n != 1 || err != nil {
					t.Fatalf("cycle once the retry is due on the database's clock = %d, %v", n, err)
				}
				mu.Lock()
				for _, l := range lags {
					if l < 0 || l > time.Minute {
						t.Errorf("lag %v is not the database's", l)
					}
				}
				mu.Unlock()

				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if skewedID, err = ob.Enqueue(ctx, tx, outbox.Message{Topic: "t", Key: "z", Payload: []byte("from the skewed process")}); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				st, err := ob.Stats(ctx)
				if err != nil || st.Pending != 1 || st.OldestPending < 0 || st.OldestPending > time.Minute {
					t.Fatalf("stats = %+v, %v; want the database's age", st, err)
				}
				if n, err := relay.Cleanup(ctx); n != 0 || err != nil {
					t.Fatalf("cleanup deleted %d rows published seconds ago (retention 1h), %v", n, err)
				}
			})
			// A relay on a good clock publishes what the skewed process
			// enqueued, at once.
			relay, err := outbox.NewRelay(writer, newRecorder(), outbox.RelayConfig{DisableListen: true, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			if n := cycle(t, relay); n != 1 {
				t.Fatalf("message %s of the skewed process: published %d, want 1", skewedID, n)
			}
		})
	}
}
