package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
)

const (
	benchTopic = "bench"
	benchGroup = "bench"
	// kafkaQueue is every Kafka consumer's read-ahead: the queue of the
	// runner's partition readers, and both the group reader's queue and each
	// partition's channel in the hand-written consumers.
	kafkaQueue = 1000
	// kafkaCommitInterval is how often the runner and the async-commit
	// baseline commit offsets (the runner's default).
	kafkaCommitInterval = time.Second
)

// Names of the Kafka rows.
const (
	kafkaHandSync  = "hand-written kafka-go consumer"
	kafkaHandAsync = "hand-written kafka-go consumer, async commits"
	kafkaRunner    = "dedupekafka.Runner"
)

// kafkaRow is one Kafka consumer measured.
type kafkaRow struct {
	name, baseline string
	run            func(b *bench, ctx context.Context, partitions int) (*result, error)
}

// kafkaRows are the Kafka consumers measured, in report order; the runner is
// reported twice, once against each baseline.
var kafkaRows = []kafkaRow{
	{kafkaHandSync, "", func(b *bench, ctx context.Context, p int) (*result, error) { return b.kafkaHand(ctx, p, false) }},
	{kafkaHandAsync, "", func(b *bench, ctx context.Context, p int) (*result, error) { return b.kafkaHand(ctx, p, true) }},
	{kafkaRunner, kafkaHandSync, (*bench).kafkaRunner},
}

// runKafka measures the Kafka runner against the two hand-written
// consumers at every worker count (= partitions). A round runs each
// consumer once, in an order that rotates from round to round; with -rounds
// > 1 the row of median throughput is kept, with the median of the rounds'
// ratios (each computed within its round).
func (rep *report) runKafka(ctx context.Context, b *bench, log io.Writer) error {
	o := rep.opts
	for _, w := range o.workers {
		type rowKey struct{ name, baseline string }
		runs := map[rowKey][]*result{}
		var order []rowKey
		for round := range o.rounds {
			var this []*result
			for i := range kafkaRows {
				row := kafkaRows[(i+round)%len(kafkaRows)]
				if !o.selected(row.name) {
					continue
				}
				if err := b.reset(ctx, fmt.Sprintf("k%d-%d-%d", w, round, i)); err != nil {
					return err
				}
				r, err := row.run(b, ctx, w)
				if err != nil {
					return fmt.Errorf("%s, %d partitions: %w", row.name, w, err)
				}
				r.scenario, r.baseline = row.name, row.baseline
				this = append(this, r)
				fmt.Fprintf(log, "bench: %-46s partitions=%-3d round=%d %9.0f msg/s p50=%v p99=%v\n", r.scenario, w, round+1, r.throughput(), r.p50, r.p99)
				if row.name == kafkaRunner {
					again := *r
					again.baseline = kafkaHandAsync
					this = append(this, &again)
				}
			}
			fillRatios(this)
			for _, r := range this {
				k := rowKey{r.scenario, r.baseline}
				if _, ok := runs[k]; !ok && round == 0 {
					order = append(order, k)
				}
				runs[k] = append(runs[k], r)
			}
		}
		slices.SortStableFunc(order, func(a, b rowKey) int { return cmp.Compare(kafkaRank(a.name), kafkaRank(b.name)) })
		for _, k := range order {
			rs := runs[k]
			ratios := make([]float64, len(rs))
			for i, r := range rs {
				ratios[i] = r.ratio
			}
			slices.Sort(ratios)
			slices.SortFunc(rs, func(a, b *result) int { return cmp.Compare(a.throughput(), b.throughput()) })
			med := *rs[len(rs)/2]
			med.ratio = ratios[len(ratios)/2]
			rep.transports = append(rep.transports, &med)
		}
	}
	return nil
}

// kafkaRank orders the rows of one worker count as kafkaRows does.
func kafkaRank(name string) int {
	return slices.IndexFunc(kafkaRows, func(r kafkaRow) bool { return r.name == name })
}

// kafkaTopic starts a kfake cluster whose topic has one partition per
// worker (Kafka's unit of parallelism) and publishes the row's messages.
func (b *bench) kafkaTopic(ctx context.Context, partitions int) (brokers []string, cleanup func(), err error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), benchTopic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return nil, nil, err
	}
	brokers = c.ListenAddrs()
	tr := &kafka.Transport{}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: benchTopic, Balancer: &kafka.RoundRobin{},
		BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll, Transport: tr}
	defer func() { _ = w.Close(); tr.CloseIdleConnections() }()
	msgs := make([]kafka.Message, 0, 1000)
	n := b.opts.transportMsgs
	for i := range n {
		id := b.run + "-" + strconv.Itoa(i)
		msgs = append(msgs, kafka.Message{Value: []byte(body), Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(id)}}})
		if len(msgs) == cap(msgs) || i == n-1 {
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				c.Close()
				return nil, nil, err
			}
			msgs = msgs[:0]
		}
	}
	return brokers, c.Close, nil
}

// benchReaderConfig is the group reader configuration of every Kafka row.
func benchReaderConfig(brokers []string) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers: brokers, GroupID: benchGroup, Topic: benchTopic, StartOffset: kafka.FirstOffset,
		MaxWait: 20 * time.Millisecond, ReadBatchTimeout: 20 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 1500 * time.Millisecond,
		RebalanceTimeout: 1500 * time.Millisecond, JoinGroupBackoff: 50 * time.Millisecond,
		QueueCapacity: kafkaQueue, MaxBytes: 4 << 20,
	}
}

// drainKafka waits until the effects table holds the row's n messages and
// returns how many were committed after the first one and how long that
// took: the clock starts at the first effect, so that joining the group
// (the same for every consumer) is not counted. More than n effects is an
// error (a duplicated effect).
func (b *bench) drainKafka(ctx context.Context) (msgs int, elapsed time.Duration, err error) {
	n := b.opts.transportMsgs
	var start time.Time
	first := 0
	for {
		var got int
		if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM bench_effects").Scan(&got); err != nil {
			return 0, 0, err
		}
		if got > n {
			return 0, 0, fmt.Errorf("%d effects for %d messages: duplicated effects", got, n)
		}
		if got > 0 && start.IsZero() {
			start, first = time.Now(), got
		}
		if got == n {
			if got == first { // all appeared at once: count them all over the poll
				return n, max(time.Since(start), 2*time.Millisecond), nil
			}
			return n - first, time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("%d of %d effects: %w", got, n, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// kafkaHand is the hand-written kafka-go consumer: a group Reader, one fetch
// loop dispatching to a worker per partition (a channel of kafkaQueue
// messages each), each running claim + effect in a transaction and then
// CommitMessages. With async the reader commits every kafkaCommitInterval
// (ReaderConfig.CommitInterval) and CommitMessages only queues the offset,
// as a careful engineer would have it; without, CommitMessages waits for the
// broker after every message. Latency: the transaction.
func (b *bench) kafkaHand(ctx context.Context, partitions int, async bool) (*result, error) {
	brokers, stopCluster, err := b.kafkaTopic(ctx, partitions)
	if err != nil {
		return nil, err
	}
	defer stopCluster()
	rc := benchReaderConfig(brokers)
	if async {
		rc.CommitInterval = kafkaCommitInterval
	}
	r := kafka.NewReader(rc)
	defer r.Close()
	rctx, stop := context.WithCancel(ctx)
	parts := make([]chan kafka.Message, partitions)
	var lat latencies
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	for p := range parts {
		parts[p] = make(chan kafka.Message, kafkaQueue)
		wg.Go(func() {
			for m := range parts[p] {
				id := dedupekafka.KeyFromHeaders(m, "Idempotency-Key")
				t0 := time.Now()
				if err := b.handClaimEffectTx(rctx, "kafka-hand", id); err != nil {
					if rctx.Err() == nil {
						errOnce.Do(func() { firstErr = err })
					}
					continue
				}
				lat.add(time.Since(t0))
				_ = r.CommitMessages(rctx, m)
			}
		})
	}
	wg.Go(func() {
		defer func() {
			for _, c := range parts {
				close(c)
			}
		}()
		for {
			m, err := r.FetchMessage(rctx)
			if err != nil {
				return
			}
			select {
			case parts[m.Partition%partitions] <- m:
			case <-rctx.Done():
				return
			}
		}
	})
	n, elapsed, err := b.drainKafka(ctx)
	stop()
	wg.Wait()
	if err == nil {
		err = firstErr
	}
	if err != nil {
		return nil, err
	}
	return drained("", "", "tx", partitions, n, elapsed, &lat), nil
}

// kafkaRunner drains the same messages with dedupekafka.Runner in
// per-message mode. Latency: the transaction, timed from BEGIN to COMMIT by
// the inbox's database handle.
func (b *bench) kafkaRunner(ctx context.Context, partitions int) (*result, error) {
	brokers, stopCluster, err := b.kafkaTopic(ctx, partitions)
	if err != nil {
		return nil, err
	}
	defer stopCluster()
	var lat latencies
	ic := b.inbox.Config()
	inbox, err := dedupe.New(timedDB{DB: b.pool, lat: &lat}, ic)
	if err != nil {
		return nil, err
	}
	run, err := dedupekafka.New(inbox, benchReaderConfig(brokers), dedupekafka.Config{Scope: "kafka-runner", CommitInterval: kafkaCommitInterval},
		func(ctx context.Context, tx pgx.Tx, _ kafka.Message) error {
			_, err := tx.Exec(ctx, sqlEffect, dedupe.ClaimFromContext(ctx).Key.ID, body)
			return err
		})
	if err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run.Run(rctx) }()
	n, elapsed, err := b.drainKafka(ctx)
	stop()
	if rerr := <-done; err == nil && rerr != nil && !errors.Is(rerr, context.Canceled) {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	return drained("", "", "tx", partitions, n, elapsed, &lat), nil
}

// timedDB is the benchmark's pool, timing every transaction from BEGIN to
// a successful COMMIT.
type timedDB struct {
	dedupe.DB
	lat *latencies
}

func (d timedDB) Begin(ctx context.Context) (pgx.Tx, error) {
	return d.BeginTx(ctx, pgx.TxOptions{})
}

func (d timedDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	t0 := time.Now()
	tx, err := d.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &timedTx{Tx: tx, t0: t0, lat: d.lat}, nil
}

type timedTx struct {
	pgx.Tx
	t0  time.Time
	lat *latencies
}

func (t *timedTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	if err == nil {
		t.lat.add(time.Since(t.t0))
	}
	return err
}
