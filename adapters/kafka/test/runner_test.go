package test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// Twenty copies of one message land on three partitions, so three partition
// workers (across two group members) claim the same key at the same moment.
func TestDuplicateKeyHeaderOneEffect(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 3)
			var msgs []kafka.Message
			for n := range 20 {
				msgs = append(msgs, msg("order-42", fmt.Sprintf("route-%d", n), []byte("pay 19.00")))
			}
			msgs = append(msgs, msg("order-43", "", []byte("pay 5.00")))
			b.produce(t, msgs...)
			cfg := dedupekafka.Config{BatchSize: batch}
			m1 := b.start(t, cfg, insertEffect)
			m2 := b.start(t, cfg, insertEffect)
			b.waitDrained(t, 30*time.Second)
			if n := b.db.Count(t, "SELECT count(*) FROM effects WHERE msg_id = 'order-42'"); n != 1 {
				t.Fatalf("effects of order-42 = %d, want 1", n)
			}
			if n := b.effects(t); n != 2 {
				t.Fatalf("effects = %d, want 2", n)
			}
			if got := m1.handled() + m2.handled(); got != 2 {
				t.Fatalf("handled = %d, want 2 (observed %s; %s)", got, m1.obs, m2.obs)
			}
			if got := m1.duplicates() + m2.duplicates(); got < 19 {
				t.Fatalf("duplicates absorbed = %d, want at least 19", got)
			}
		})
	}
}

// killSwitch is a kafka.Dialer's DialFunc whose kill closes every
// connection it made and refuses new ones: the member's process is cut off
// from the broker as if it had crashed, while the test still controls it.
type killSwitch struct {
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

func (k *killSwitch) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		return nil, errors.New("killed")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		k.conns = append(k.conns, c)
	}
	return c, err
}

func (k *killSwitch) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for _, c := range k.conns {
		_ = c.Close()
	}
}

// A member is cut off from the broker after committing effects to the
// database and before committing any offset (its commit interval is an
// hour): the second member gets every partition, is redelivered the first
// member's messages and absorbs them; every effect lands once.
func TestCrashBeforeOffsetCommitSecondMemberAbsorbs(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	const total = 200
	b.produce(t, numbered(total, "o-%d", []byte("x"))...)
	ks := &killSwitch{}
	first := b.start(t, dedupekafka.Config{CommitInterval: time.Hour}, insertEffect, func(rc *kafka.ReaderConfig) {
		rc.Dialer = &kafka.Dialer{Timeout: 5 * time.Second, DialFunc: ks.dial}
	})
	first.obs.Wait(t, 30*time.Second, "the first member to handle 50 messages", func() bool { return first.handled() >= 50 })
	ks.kill()
	second := b.start(t, dedupekafka.Config{}, insertEffect)
	b.waitDrained(t, 45*time.Second)
	b.wantEffects(t, total)
	if n := first.events(dedupe.EventOffsetsCommitted); n != 0 {
		t.Fatalf("the first member committed offsets: %s", first.obs)
	}
	// A transaction whose COMMIT was under way when the member was cut off
	// (its context ends with the generation) may have committed without the
	// runner knowing: it is not counted, and its redelivery is a duplicate.
	if first.handled()+second.handled() > total {
		t.Fatalf("handled %d + %d, more than %d", first.handled(), second.handled(), total)
	}
	if second.duplicates() < 50 {
		t.Fatalf("the second member absorbed %d redeliveries, want at least 50: first %s; second %s", second.duplicates(), first.obs, second.obs)
	}
	t.Logf("cut-off member handled %d; survivor handled %d and absorbed %d redeliveries", first.handled(), second.handled(), second.duplicates())
}

func TestTenThousandTwoMembersBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	const total, dupRate = 10_000, 0.2
	rng := rand.New(rand.NewPCG(4, 2))
	var ids []string
	unique := map[string]bool{}
	var msgs []kafka.Message
	for n := 0; len(msgs) < total; n++ {
		id := fmt.Sprintf("m-%d", n)
		if len(ids) > 0 && rng.Float64() < dupRate {
			id = ids[rng.IntN(len(ids))]
		}
		ids = append(ids, id)
		unique[id] = true
		msgs = append(msgs, msg(id, "", []byte(id)))
	}
	cfg := dedupekafka.Config{BatchSize: 100}
	m1 := b.start(t, cfg, insertEffect)
	m2 := b.start(t, cfg, insertEffect)
	b.produce(t, msgs...)
	b.waitDrained(t, 50*time.Second)
	b.wantEffects(t, len(unique))
	if got := m1.obs.Started("") + m2.obs.Started(""); got < total {
		t.Fatalf("handlings started %d, want at least %d", got, total)
	}
	if m1.events(dedupe.EventBatchHandled)+m2.events(dedupe.EventBatchHandled) == 0 ||
		m1.events(dedupe.EventBatchFallback)+m2.events(dedupe.EventBatchFallback) != 0 {
		t.Fatalf("want batch transactions and no fallback: %s; %s", m1.obs, m2.obs)
	}
	t.Logf("member 1 %s", m1.obs)
	t.Logf("member 2 %s", m2.obs)
}

// One message of a batch fails, then panics, then succeeds: every other
// message commits exactly once, in partition order, and the failing one is
// retried with its attempts counted.
func TestBatchWithOneFailingMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	msgs := numbered(30, "b-%02d", nil)
	b.produce(t, msgs...)
	var calls atomic.Int32
	m := b.start(t, dedupekafka.Config{BatchSize: 30, Linger: 200 * time.Millisecond, RetryBackoff: 10 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			if err := insertEffect(ctx, tx, m); err != nil {
				return err
			}
			if string(m.Headers[0].Value) == "b-07" {
				switch calls.Add(1) {
				case 1:
					return errors.New("transient")
				case 2:
					panic("boom")
				}
			}
			return nil
		})
	b.waitDrained(t, 30*time.Second)
	b.wantEffects(t, 30)
	if n := calls.Load(); n != 3 {
		t.Fatalf("handler calls for b-07 = %d, want 3", n)
	}
	if n := b.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'b-07'"); n != 3 {
		t.Fatalf("attempts of b-07 = %d, want 3", n)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key <> 'b-07' AND attempts <> 1"); n != 0 {
		t.Fatalf("%d other keys took more than one attempt", n)
	}
	// Effects were written in offset order.
	if n := b.db.Count(t, `SELECT count(*) FROM (SELECT off, lag(off) OVER (ORDER BY id) AS prev FROM effects) s WHERE off < prev`); n != 0 {
		t.Fatalf("%d effects out of partition order", n)
	}
	if m.events(dedupe.EventBatchFallback) == 0 || m.events(dedupe.EventRetried) < 2 {
		t.Fatalf("want a fallback and two retries: %s", m.obs)
	}
}

// The connection of a batch transaction is killed with pg_terminate_backend
// in the middle of the batch: nothing is lost or doubled.
func TestBatchConnectionKilled(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	msgs := numbered(40, "k-%02d", nil)
	b.produce(t, msgs...)
	var killed atomic.Bool
	b.start(t, dedupekafka.Config{BatchSize: 40, Linger: 200 * time.Millisecond, RetryBackoff: 10 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			if err := insertEffect(ctx, tx, m); err != nil {
				return err
			}
			if string(m.Headers[0].Value) == "k-20" && killed.CompareAndSwap(false, true) {
				var pid uint32
				if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return err
				}
				if _, err := b.db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "SELECT 1")
				return err // the connection is gone
			}
			return nil
		})
	b.waitDrained(t, 30*time.Second)
	if !killed.Load() {
		t.Fatal("the connection was never killed")
	}
	b.wantEffects(t, 40)
}

// A message that always fails is marked failed after MaxAttempts, written
// to the dead-letter topic with its origin, and its offset committed; so is
// a message whose key cannot be stored. The others flow.
func TestPoisonDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	brokersDLQ := b.brokers
	dlq := newWriter(t, brokersDLQ, "orders.dlq", 1)
	dlq.AllowAutoTopicCreation = true
	var msgs []kafka.Message
	for n := range 10 {
		msgs = append(msgs, msg(fmt.Sprintf("ok-%d", n), "", []byte("fine")))
		if n == 3 {
			msgs = append(msgs, msg("poison", "", []byte("\x00garbage")))
		}
		if n == 6 {
			msgs = append(msgs, msg(strings.Repeat("k", 300), "", []byte("too long a key")))
		}
	}
	b.produce(t, msgs...)
	m := b.start(t, dedupekafka.Config{BatchSize: 20, MaxAttempts: 3, RetryBackoff: 10 * time.Millisecond, DeadLetter: dlq},
		func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			if string(m.Value) == "\x00garbage" {
				return fmt.Errorf("cannot decode %q", m.Value)
			}
			return insertEffect(ctx, tx, m)
		})
	b.waitDrained(t, 30*time.Second)
	if n := b.effects(t); n != 10 {
		t.Fatalf("effects = %d, want 10", n)
	}
	if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE key = 'poison' AND state = 'failed' AND attempts = 3"); n != 1 {
		t.Fatalf("poison key not failed after 3 attempts")
	}
	if m.events(dedupe.EventTerminated) != 2 || m.events(dedupe.EventDeadLettered) != 2 ||
		m.obs.Handled(dedupe.OutcomePoisoned) != 1 || m.events(dedupe.EventRefused) != 1 {
		t.Fatalf("want 2 messages given up and dead-lettered, 1 poisoned and 1 refused: %s", m.obs)
	}

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokersDLQ, Topic: "orders.dlq", Partition: 0, MaxWait: 500 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := map[string]map[string]string{}
	for range 2 {
		dm, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read dead letter: %v", err)
		}
		h := map[string]string{}
		for _, kv := range dm.Headers {
			h[kv.Key] = string(kv.Value)
		}
		got[string(dm.Value)] = h
	}
	p := got["\x00garbage"]
	if p == nil || p[dedupekafka.HeaderDeadLetterTopic] != "orders" || p[dedupekafka.HeaderDeadLetterOffset] != "4" ||
		!strings.Contains(p[dedupekafka.HeaderDeadLetterError], "cannot decode") {
		t.Fatalf("poison dead letter headers = %v", p)
	}
	if l := got["too long a key"]; l == nil || !strings.Contains(l[dedupekafka.HeaderDeadLetterError], "too long") {
		t.Fatalf("long-key dead letter headers = %v", l)
	}
}

// Messages of one order key (one partition) are handled in publish order,
// while three partitions run concurrently.
func TestOrderedPerPartition(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	var msgs []kafka.Message
	for seq := range 100 {
		for acct := range 6 {
			msgs = append(msgs, msg(fmt.Sprintf("a%d-%03d", acct, seq), fmt.Sprintf("acct-%d", acct), []byte(fmt.Sprintf("acct-%d", acct))))
		}
	}
	b.produce(t, msgs...)
	var mu sync.Mutex
	inflight, peak := map[int]bool{}, 0
	b.start(t, dedupekafka.Config{BatchSize: 10}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		mu.Lock()
		inflight[m.Partition] = true
		peak = max(peak, len(inflight))
		mu.Unlock()
		time.Sleep(200 * time.Microsecond)
		err := insertEffect(ctx, tx, m)
		mu.Lock()
		delete(inflight, m.Partition)
		mu.Unlock()
		return err
	})
	b.waitDrained(t, 30*time.Second)
	if n := b.effects(t); n != 600 {
		t.Fatalf("effects = %d, want 600", n)
	}
	if n := b.db.Count(t, `SELECT count(*) FROM (
		SELECT msg_id, lag(msg_id) OVER (PARTITION BY body ORDER BY id) AS prev FROM effects) s
		WHERE msg_id < prev`); n != 0 {
		t.Fatalf("%d effects out of per-key order", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if peak < 2 {
		t.Fatalf("partitions never ran concurrently (peak %d)", peak)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	if _, err := dedupekafka.New(b.inbox, kafka.ReaderConfig{Brokers: b.brokers, Topic: b.topic}, dedupekafka.Config{}, insertEffect); !errors.Is(err, dedupekafka.ErrNoGroup) {
		t.Fatalf("no group: err = %v, want ErrNoGroup", err)
	}
	r := readerConfig(b.brokers, b.group, b.topic)
	dlq := func(edit func(w *kafka.Writer)) *kafka.Writer {
		w := &kafka.Writer{Addr: kafka.TCP(b.brokers...), Topic: "orders.dlq", RequiredAcks: kafka.RequireAll}
		edit(w)
		return w
	}
	for name, c := range map[string]struct {
		cfg   dedupekafka.Config
		field string
	}{
		"negative batch":           {dedupekafka.Config{BatchSize: -1}, "BatchSize"},
		"negative linger":          {dedupekafka.Config{Linger: -time.Second}, "Linger"},
		"backoff over max":         {dedupekafka.Config{RetryBackoff: time.Minute, MaxRetryBackoff: time.Second}, "MaxRetryBackoff"},
		"bad scope":                {dedupekafka.Config{Scope: "a\nb"}, "Scope"},
		"negative commit interval": {dedupekafka.Config{CommitInterval: -time.Second}, "CommitInterval"},
		"negative DLQ attempts":    {dedupekafka.Config{DeadLetterAttempts: -1}, "DeadLetterAttempts"},
		// An asynchronous writer returns before the dead letter is durable:
		// the offset would be committed for a copy that may be lost.
		"async dead letter":       {dedupekafka.Config{DeadLetter: dlq(func(w *kafka.Writer) { w.Async = true })}, "DeadLetter.Async"},
		"fire-and-forget DLQ":     {dedupekafka.Config{DeadLetter: dlq(func(w *kafka.Writer) { w.RequiredAcks = kafka.RequireNone })}, "DeadLetter.RequiredAcks"},
		"dead letter no topic":    {dedupekafka.Config{DeadLetter: dlq(func(w *kafka.Writer) { w.Topic = "" })}, "DeadLetter.Topic"},
		"dead letter to consumed": {dedupekafka.Config{DeadLetter: dlq(func(w *kafka.Writer) { w.Topic = b.topic })}, "DeadLetter.Topic"},
	} {
		var ce *dedupe.ConfigError
		if _, err := dedupekafka.New(b.inbox, r, c.cfg, insertEffect); !errors.Is(err, dedupe.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%s: err = %v, want a *dedupe.ConfigError for %s", name, err, c.field)
		}
	}
	for name, rc := range map[string]kafka.ReaderConfig{
		"no topic":        {Brokers: b.brokers, GroupID: "g"},
		"partition":       {Brokers: b.brokers, GroupID: "g", Topic: "t", Partition: 3},
		"no brokers":      {GroupID: "g", Topic: "t"},
		"backoff min>max": {Brokers: b.brokers, GroupID: "g", Topic: "t", ReadBackoffMin: 2 * time.Second},
		"min over max":    {Brokers: b.brokers, GroupID: "g", Topic: "t", MinBytes: 10, MaxBytes: 5},
	} {
		if _, err := dedupekafka.New(b.inbox, rc, dedupekafka.Config{}, insertEffect); !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Errorf("reader config %s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := dedupekafka.New(b.inbox, r, dedupekafka.Config{}, dedupekafka.HandlerFunc(nil)); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Errorf("nil handler: err = %v", err)
	}
	run, err := dedupekafka.New(b.inbox, r, dedupekafka.Config{}, insertEffect)
	if err != nil {
		t.Fatal(err)
	}
	if run.Scope() != b.group {
		t.Errorf("scope = %q, want the group id %q", run.Scope(), b.group)
	}
}

func TestKeyFromHeaders(t *testing.T) {
	t.Parallel()
	m := kafka.Message{Topic: "t", Partition: 2, Offset: 17}
	if got := dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...); got != "" {
		t.Errorf("no header: %q, want none", got)
	}
	if got := dedupekafka.OffsetKey(m); got != "t/2/17" {
		t.Errorf("offset key: %q", got)
	}
	m.Headers = []kafka.Header{{Key: "MESSAGE-ID", Value: []byte("mid")}}
	if got := dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...); got != "mid" {
		t.Errorf("message-id: %q", got)
	}
	m.Headers = append(m.Headers, kafka.Header{Key: "Idempotency-Key", Value: []byte("idem")}, kafka.Header{Key: "x", Value: []byte("custom")})
	if got := dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...); got != "idem" {
		t.Errorf("both: %q, want the Idempotency-Key", got)
	}
	if got := dedupekafka.KeyFromHeaders(m, "x"); got != "custom" {
		t.Errorf("configured header: %q", got)
	}
	m.Headers = []kafka.Header{{Key: "Idempotency-Key", Value: nil}}
	if got := dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...); got != "" {
		t.Errorf("empty header: %q, want none", got)
	}
}

// A batch handler that fails for a batch holding one bad message: the batch
// is rolled back, every message is handled alone, the bad one is retried
// until it succeeds, and every effect lands exactly once.
func TestBatchHandlerFallback(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	msgs := numbered(30, "b-%02d", nil)
	b.produce(t, msgs...)
	var bad atomic.Int32
	var sizes sync.Map
	m := b.startBatch(t, dedupekafka.Config{BatchSize: 30, Linger: 200 * time.Millisecond, RetryBackoff: 10 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx, ms []kafka.Message) error {
			sizes.Store(len(ms), true)
			if err := insertEffects(ctx, tx, ms); err != nil {
				return err
			}
			for _, m := range ms {
				if string(m.Headers[0].Value) == "b-07" && bad.Add(1) <= 2 {
					return errors.New("b-07 is not ready")
				}
			}
			return nil
		})
	b.waitDrained(t, 30*time.Second)
	b.wantEffects(t, 30)
	// The batch failure cannot be pinned on one message and is not counted;
	// the lone retry that failed is.
	if n := b.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'b-07'"); n != 2 {
		t.Fatalf("attempts of b-07 = %d, want 2", n)
	}
	if _, ok := sizes.Load(30); !ok {
		t.Fatal("the handler never saw the whole batch")
	}
	if m.events(dedupe.EventBatchFallback) != 1 || m.handled() != 30 {
		t.Fatalf("want one fallback and 30 handled: %s", m.obs)
	}
}

// The same key with another payload (fingerprint) is a producer bug: it is
// not handled and not answered with the first result, but given up and
// dead-lettered, whether it arrives in the same batch or a later one.
func TestFingerprintConflictDeadLettered(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			dlq := newWriter(t, b.brokers, "orders.dlq", 1)
			b.produce(t, msg("k1", "", []byte("pay 10")), msg("k2", "", []byte("pay 2")),
				msg("k1", "", []byte("pay 99")), msg("k1", "", []byte("pay 10")))
			m := b.start(t, dedupekafka.Config{BatchSize: batch, Linger: 100 * time.Millisecond, DeadLetter: dlq,
				Fingerprint: func(m kafka.Message) []byte { return m.Value }}, insertEffect)
			b.waitDrained(t, 30*time.Second)
			if n := b.effects(t); n != 2 {
				t.Fatalf("effects = %d, want 2", n)
			}
			if n := b.db.Count(t, "SELECT count(*) FROM effects WHERE msg_id = 'k1' AND body = 'pay 10'"); n != 1 {
				t.Fatalf("k1 effects with the first payload = %d, want 1", n)
			}
			if m.events(dedupe.EventTerminated) != 1 || m.events(dedupe.EventDeadLettered) != 1 || m.duplicates() != 1 ||
				m.events(dedupe.EventRefused) != 1 {
				t.Fatalf("want one conflict refused and dead-lettered, and one duplicate: %s", m.obs)
			}
			// The conflicting message has no failed key of its own: it is
			// recorded under its RefusedKey.
			if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox WHERE state = 'failed' AND key LIKE $1 AND last_error LIKE '%different payload%'",
				dedupekafka.RefusedKeyPrefix+"orders/0/2/%"); n != 1 {
				t.Fatalf("refused conflict rows = %d, want 1", n)
			}
		})
	}
}

// A second member joins while the first is mid-stream: the rebalance hands
// partitions over with offsets not yet committed, and the exact count holds.
func TestMemberJoinsMidStream(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const total = 3000
	msgs := numbered(total, "j-%d", []byte("x"))
	slow := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		time.Sleep(100 * time.Microsecond)
		return insertEffect(ctx, tx, m)
	}
	cfg := dedupekafka.Config{BatchSize: 50}
	m1 := b.start(t, cfg, slow)
	b.produce(t, msgs...)
	dbtest.WaitFor(t, 30*time.Second, "the first member to be under way", func() bool { return b.effects(t) >= total/10 })
	m2 := b.start(t, cfg, slow)
	b.waitDrained(t, 45*time.Second)
	b.wantEffects(t, total)
	if m2.obs.Started("") == 0 {
		t.Fatalf("the second member never got a partition: %s", m2.obs)
	}
	t.Logf("first %s", m1.obs)
	t.Logf("second %s", m2.obs)
}

// Config.MaxAttempts, not the inbox's, decides when a batch-mode message is
// given up: when the batch claim takes over a key an earlier run left with
// one failed attempt, and when a handler fails inside a batch.
func TestBatchModeUsesRunnerMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	strict := dedupe.Config{MaxAttempts: 1}
	// An earlier run of the group failed once on b-03 (and died).
	if _, poisoned, err := b.inbox.RecordFailure(ctx, dedupe.Key{Scope: b.group, ID: "b-03"}, errors.New("earlier run")); err != nil || poisoned {
		t.Fatalf("seed failed attempt: poisoned %v, err %v", poisoned, err)
	}
	msgs := numbered(10, "b-%02d", nil)
	b.produce(t, msgs...)
	cfg := dedupekafka.Config{BatchSize: 10, Linger: 200 * time.Millisecond, MaxAttempts: 3, RetryBackoff: 10 * time.Millisecond}
	m := b.startWith(t, strict, func(inbox *dedupe.Inbox, rc kafka.ReaderConfig) (*dedupekafka.Runner, error) {
		return dedupekafka.New(inbox, rc, cfg, insertEffect)
	})
	b.waitDrained(t, 30*time.Second)
	if n := b.effects(t); n != 10 {
		t.Fatalf("effects = %d, want 10 (observed %s)", n, m.obs)
	}
	if n := b.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'b-03' AND state = 'complete'"); n != 2 {
		t.Fatalf("b-03: complete on attempt %d, want 2", n)
	}
	if m.events(dedupe.EventTerminated) != 0 || m.events(dedupe.EventBatchHandled) != 1 || m.obs.Covered(dedupe.EventBatchHandled) != 10 {
		t.Fatalf("want one batch of 10 and nothing given up: %s", m.obs)
	}
	m.stop(t)

	// A message that always fails in a batch gets the runner's 3 attempts.
	var calls atomic.Int32
	b.produce(t, msg("c-00", "", nil), msg("poison", "", nil), msg("c-01", "", nil))
	m = b.startWith(t, strict, func(inbox *dedupe.Inbox, rc kafka.ReaderConfig) (*dedupekafka.Runner, error) {
		return dedupekafka.New(inbox, rc, cfg, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			if string(m.Headers[0].Value) == "poison" {
				calls.Add(1)
				return errors.New("cannot decode")
			}
			return insertEffect(ctx, tx, m)
		})
	})
	b.waitDrained(t, 30*time.Second)
	if n := b.effects(t); n != 12 {
		t.Fatalf("effects = %d, want 12", n)
	}
	if n := b.db.Count(t, "SELECT attempts FROM dedupe_inbox WHERE key = 'poison' AND state = 'failed'"); n != 3 {
		t.Fatalf("poison: failed after %d attempts, want 3", n)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("handler calls for poison = %d, want 3", n)
	}
	if m.events(dedupe.EventTerminated) != 1 || m.events(dedupe.EventBatchFallback) != 1 {
		t.Fatalf("want one fallback and one message given up: %s", m.obs)
	}
}

// A member stopped while its handler is inside the transaction commits
// neither the effects nor the offset (and counts no attempt); the next member
// handles every message once.
func TestStoppedMidHandlerCommitsNoOffset(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 5} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			b.produce(t, numbered(5, "s-%d", nil)...)
			cfg := dedupekafka.Config{BatchSize: batch, Linger: 100 * time.Millisecond}
			started := make(chan struct{}, 1)
			m1 := b.start(t, cfg, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
				if err := insertEffect(ctx, tx, m); err != nil {
					return err
				}
				select {
				case started <- struct{}{}:
				default:
				}
				<-ctx.Done() // stuck until the member is stopped
				return ctx.Err()
			})
			select {
			case <-started:
			case <-time.After(30 * time.Second):
				t.Fatal("the handler never started")
			}
			if err := m1.stop(t); err != nil {
				t.Fatalf("stop: %v", err)
			}
			if n := b.effects(t); n != 0 {
				t.Fatalf("effects after the stop = %d, want 0 (rolled back)", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if lag, err := groupLag(ctx, b.brokers, b.group, b.topic); err != nil || lag != 5 {
				t.Fatalf("lag after the stop = %d, %v; want 5 (no offset committed)", lag, err)
			}
			if n := b.db.Count(t, "SELECT count(*) FROM dedupe_inbox"); n != 0 {
				t.Fatalf("inbox rows after the stop = %d, want 0 (a shutdown is not a failed attempt)", n)
			}
			m2 := b.start(t, cfg, insertEffect)
			b.waitDrained(t, 30*time.Second)
			b.wantEffects(t, 5)
			if m2.handled() != 5 || m2.duplicates() != 0 || m2.events(dedupe.EventRetried) != 0 {
				t.Fatalf("second member: want 5 handled, no duplicate, no retry: %s", m2.obs)
			}
		})
	}
}

// In batch mode a handler stores its message's result with
// Inbox.StoreResultTx in the batch transaction; a duplicate's key then has it.
func TestBatchHandlerStoresResultTx(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, numbered(5, "r-%d", nil)...)
	m := b.start(t, dedupekafka.Config{BatchSize: 5, Linger: 100 * time.Millisecond}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if err := insertEffect(ctx, tx, m); err != nil {
			return err
		}
		c := dedupe.ClaimFromContext(ctx)
		return b.inbox.StoreResultTx(ctx, tx, c, dedupe.Result{Status: 200, Body: []byte("done " + c.Key.ID)})
	})
	b.waitDrained(t, 30*time.Second)
	b.wantEffects(t, 5)
	if m.events(dedupe.EventBatchHandled) == 0 {
		t.Fatalf("no batch transaction: %s", m.obs)
	}
	for n := range 5 {
		id := fmt.Sprintf("r-%d", n)
		rec, err := b.inbox.Lookup(context.Background(), dedupe.Key{Scope: b.group, ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != dedupe.StateComplete || rec.Result == nil || rec.Result.Status != 200 || string(rec.Result.Body) != "done "+id {
			t.Fatalf("%s: state %s, result %+v; want complete with its stored result", id, rec.State, rec.Result)
		}
	}
}

func TestBatchModeStoresSetResult(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, numbered(5, "s-%d", nil)...)
	m := b.start(t, dedupekafka.Config{BatchSize: 5, Linger: 100 * time.Millisecond}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		c := dedupe.ClaimFromContext(ctx)
		c.SetResult(dedupe.Result{Status: 201, Body: []byte("set " + c.Key.ID)})
		return insertEffect(ctx, tx, m)
	})
	b.waitDrained(t, 30*time.Second)
	b.wantEffects(t, 5)
	if m.events(dedupe.EventBatchHandled) == 0 {
		t.Fatalf("no batch transaction: %s", m.obs)
	}
	for n := range 5 {
		id := fmt.Sprintf("s-%d", n)
		rec, err := b.inbox.Lookup(context.Background(), dedupe.Key{Scope: b.group, ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Result == nil || rec.Result.Status != 201 || string(rec.Result.Body) != "set "+id {
			t.Fatalf("%s: result %+v; want the one SetResult recorded", id, rec.Result)
		}
	}
}
