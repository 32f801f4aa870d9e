package failover

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/dedupe"
	dedupenats "github.com/exactlyonce/dedupe/adapters/nats"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	"github.com/exactlyonce/dedupe/internal/natstest"
	"github.com/exactlyonce/dedupe/internal/pgproxy"
)

// Flags of the long runs (.ci/failover); the defaults are the short runs of
// the default test run.
var (
	runs      = flag.Int("failover.runs", 1, "runs of TestFailoverSync and TestFailoverAsync")
	messages  = flag.Int("failover.messages", 300, "unique messages per run")
	failovers = flag.Int("failover.failovers", 2, "failovers per run")
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

func newPool(t testing.TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// setupSchema migrates the inbox and creates the effects table on the
// cluster's primary.
func setupSchema(t testing.TB, c *Cluster) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := dedupe.Migrate(ctx, conn, dedupe.MigrateConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE effects (order_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

func insertEffect(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, id)
	return err
}

// TestFailoverLostCommitReplyResolvedOnNewPrimary: the reply to a COMMIT is
// lost as the primary goes down; the transaction had reached the
// synchronous standby. Handle's resolver must wait out the failover (the
// old primary refusing connections with 57P03, the standby read only until
// promoted) and learn on the new primary that the claim committed, instead
// of reporting ErrOutcomeUnknown at its first try. Without the resolver's
// fix this test fails: Handle returns before the promotion.
func TestFailoverLostCommitReplyResolvedOnNewPrimary(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := Start(t, Options{Sync: true})
	setupSchema(t, c)

	// A session of the old primary's that stays open keeps a smart
	// shutdown refusing new connections (57P03) until Kill.
	holder, err := pgx.Connect(ctx, c.PrimaryURL())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.WithoutCancel(ctx))

	// The consumer reaches the primary through a proxy that drops the
	// COMMIT's reply after the primary answered it, once the primary is
	// on its way down.
	stopErr := make(chan error, 1)
	var done atomic.Bool
	p, err := pgproxy.Start(fmt.Sprintf("127.0.0.1:%d", c.Ports()[0]), func(ev pgproxy.Event) pgproxy.Action {
		if ev.Kind == pgproxy.Commit && done.CompareAndSwap(false, true) {
			stopErr <- c.SmartStop(ctx)
			return pgproxy.DropReply
		}
		return pgproxy.Forward
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proxyPort := p.Addr()[len("127.0.0.1:"):]
	url := fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%s,%d user=postgres dbname=postgres sslmode=disable "+
		"target_session_attrs=read-write connect_timeout=5", proxyPort, c.Ports()[1])
	// One connection: the resolver must connect anew, not reuse a session
	// the smart shutdown lets run on.
	pool := newPool(t, url, 1)
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{Scope: "orders",
		Key: func(s string) (string, error) { return s, nil }},
		func(ctx context.Context, tx pgx.Tx, id string) error { return insertEffect(ctx, tx, id) })
	if err != nil {
		t.Fatal(err)
	}

	type result struct {
		out dedupe.Outcome
		err error
	}
	res := make(chan result, 1)
	go func() {
		out, err := cons.Handle(ctx, "o-1")
		res <- result{out, err}
	}()
	select {
	case err := <-stopErr:
		if err != nil {
			t.Fatal(err)
		}
	case r := <-res:
		t.Fatalf("Handle returned %v, %v before its COMMIT reached the proxy", r.out, r.err)
	}
	// Pace by progress: the resolver has met the refusing primary and the
	// read-only standby three times before the failover happens.
	conns := p.Stats().Conns
	for p.Stats().Conns < conns+3 {
		select {
		case r := <-res:
			t.Fatalf("Handle returned %v, %v before the standby was promoted: the resolver gave up on a failover in progress", r.out, r.err)
		case <-ctx.Done():
			t.Fatal("the resolver did not try again")
		case <-time.After(5 * time.Millisecond):
		}
	}
	c.Kill()
	c.Promote()
	r := <-res
	if r.err != nil || r.out != dedupe.OutcomeClaimed {
		t.Fatalf("Handle with its COMMIT reply lost in a failover = %v, %v; want claimed (resolved on the new primary)", r.out, r.err)
	}
	if n := p.Stats().DroppedReplys; n != 1 {
		t.Fatalf("the proxy dropped %d COMMIT replies, want 1", n)
	}
	// The new primary has the effect once; a redelivery is a duplicate.
	direct := newPool(t, c.PrimaryURL(), 2)
	var effects int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM effects WHERE order_id = 'o-1'`).Scan(&effects); err != nil {
		t.Fatal(err)
	}
	if effects != 1 {
		t.Fatalf("effects on the new primary = %d, want 1", effects)
	}
	// The new primary has no synchronous standby yet: the redelivery's
	// duplicate commits nothing, so it does not wait for one.
	if out, err := cons.Handle(ctx, "o-1"); err != nil || out != dedupe.OutcomeDuplicate {
		t.Fatalf("redelivery on the new primary = %v, %v; want duplicate", out, err)
	}
}

// loadResult is what one run of runLoad counted on the final primary.
type loadResult struct {
	unique, published int
	missing, doubled  int
	torn              int // a complete claim without its effect, or an effect without its claim
	stalled           int // messages handled while replication stalled before the first failover
	stallEnd          string
	elapsed           time.Duration
}

// runLoad drives n unique messages plus duplicates through JetStream and a
// NATS runner of 8 workers into a consumer on the cluster's multi-host
// connection string, fails the cluster over at every n/(failovers+1)
// handled messages, waits until the broker has every message acknowledged
// and counts the effects on the last primary. With two failovers or more the
// first one is a machine failure after replication stalled (see below); the
// others kill the primary with pg_ctl stop -m immediate.
func runLoad(t *testing.T, opts Options, n, failovers int) loadResult {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := Start(t, opts)
	setupSchema(t, c)
	pool := newPool(t, c.URL(), 10)
	inbox, err := dedupe.New(pool, dedupe.Config{})
	if err != nil {
		t.Fatal(err)
	}

	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	published := 0
	for i := range n {
		id := "o" + strconv.Itoa(i)
		copies := 1
		if i%5 == 0 { // a fifth of the messages arrive twice
			copies = 2
		}
		for range copies {
			m := nats.NewMsg("in.orders")
			m.Header.Set("Order-Id", id)
			if _, err := js.PublishMsgAsync(m); err != nil {
				t.Fatal(err)
			}
			published++
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("publishing did not complete")
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "IN", jetstream.ConsumerConfig{Durable: "svc",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	r, err := dedupenats.New(inbox, cons, dedupenats.Config{Key: dedupenats.HeaderKey("Order-Id"), Workers: 8,
		Heartbeat: time.Second, MaxAttempts: -1, Backoff: func(int) time.Duration { return 50 * time.Millisecond },
		InFlightDelay: 100 * time.Millisecond, DrainTimeout: 5 * time.Second},
		func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
			if err := insertEffect(ctx, tx, msg.Headers().Get("Order-Id")); err != nil {
				return err
			}
			handled.Add(1)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	var res loadResult
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	stop := func() {
		cancel()
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("runner: %v", err)
		}
	}

	// Pace the failovers by progress; a run fails only for lack of it.
	progress := func(what string, done func() (bool, int64)) {
		last, at := int64(-1), time.Now()
		for {
			ok, mark := done()
			if ok {
				return
			}
			if mark != last {
				last, at = mark, time.Now()
			} else if time.Since(at) > 90*time.Second {
				stop()
				t.Fatalf("no progress for 90s waiting for %s (at %d)\n%s", what, mark, c.Logs())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for f := 1; f <= failovers; f++ {
		mark := int64(n * f / (failovers + 1))
		progress(fmt.Sprintf("%d handled before failover %d", mark, f), func() (bool, int64) {
			h := handled.Load()
			return h >= mark, h
		})
		if f > 1 || failovers == 1 {
			c.Failover()
			continue
		}
		// The first failover is a machine failure after the network to the
		// standby stalled: the primary's WAL senders are stopped while the
		// load goes on, then every process of the primary is killed. With
		// asynchronous replication the commits of the stall were
		// acknowledged and are lost; with synchronous replication they wait
		// and nothing is acknowledged.
		c.StallReplication(ctx)
		h0 := handled.Load()
		res.stalled = -1
		progress("load during the stalled replication", func() (bool, int64) {
			h := handled.Load()
			if h >= h0+int64(n/20) {
				res.stallEnd = "handled" // asynchronous: acknowledged, not on the standby
				return true, h
			}
			if info, err := cons.Info(ctx); err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
				res.stallEnd = "load done" // asynchronous: the load ended in the stall
				return true, h
			}
			// Synchronous: every worker waits, for the standby or for a
			// key that a waiting transaction holds.
			w := waitingForStandby(t, c)
			res.stallEnd = "workers waiting"
			return w >= 8, h*100 + int64(w)
		})
		res.stalled = int(handled.Load() - h0)
		c.Crash()
		c.Promote()
		c.Rebuild()
	}
	progress("every message acknowledged", func() (bool, int64) {
		info, err := cons.Info(ctx)
		if err != nil {
			return false, -1
		}
		return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0,
			int64(info.AckFloor.Stream)
	})
	stop()

	res.unique, res.published = n, published
	final := newPool(t, c.PrimaryURL(), 2)
	qctx := context.Background()
	counts := map[string]int{}
	rows, err := final.Query(qctx, `SELECT order_id, count(*) FROM effects GROUP BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var k int
		if err := rows.Scan(&id, &k); err != nil {
			t.Fatal(err)
		}
		counts[id] = k
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		switch k := counts["o"+strconv.Itoa(i)]; {
		case k == 0:
			res.missing++
		case k > 1:
			res.doubled += k - 1
		}
	}
	if err := final.QueryRow(qctx, `SELECT count(*) FROM (
		SELECT key FROM dedupe_inbox WHERE scope = 'svc' AND state = 'complete'
		EXCEPT SELECT order_id FROM effects) torn`).Scan(&res.torn); err != nil {
		t.Fatal(err)
	}
	var effectsWithoutClaim int
	if err := final.QueryRow(qctx, `SELECT count(*) FROM (
		SELECT order_id FROM effects
		EXCEPT SELECT key FROM dedupe_inbox WHERE scope = 'svc' AND state = 'complete') torn`).Scan(&effectsWithoutClaim); err != nil {
		t.Fatal(err)
	}
	res.torn += effectsWithoutClaim
	res.elapsed = time.Since(start)
	return res
}

// waitingForStandby counts the primary's sessions whose COMMIT waits for a
// synchronous standby, or that wait for a lock (a key) that such a
// transaction holds.
func waitingForStandby(t *testing.T, c *Cluster) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.PrimaryURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event = 'SyncRep' OR wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFailoverSync: with synchronous replication every acknowledged
// message keeps its effect across repeated failovers, and none is doubled.
func TestFailoverSync(t *testing.T) {
	t.Parallel()
	var missing, duplicated int
	start := time.Now()
	for run := 1; run <= *runs; run++ {
		res := runLoad(t, Options{Sync: true}, *messages, *failovers)
		missing, duplicated = missing+res.missing, duplicated+res.doubled
		t.Logf("sync run %d: %d unique messages (%d published), %d failovers: missing %d, duplicated %d, torn %d, "+
			"handled in the stall %d (%s), %v", run, res.unique, res.published, *failovers, res.missing, res.doubled, res.torn,
			res.stalled, res.stallEnd, res.elapsed.Round(time.Millisecond))
		if res.missing != 0 || res.doubled != 0 || res.torn != 0 {
			t.Fatalf("sync run %d: missing %d, duplicated %d, torn %d; want 0, 0, 0", run, res.missing, res.doubled, res.torn)
		}
	}
	t.Logf("sync: missing %d, duplicated %d in %d runs of %d failovers (%v)", missing, duplicated, *runs, *failovers,
		time.Since(start).Round(time.Second))
}
