package test

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactlyonce/dedupe"
	dedupekafka "github.com/exactlyonce/dedupe/adapters/kafka"
	"github.com/exactlyonce/dedupe/internal/adaptertest"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

var suiteGroups atomic.Int64

// transport describes the adapter to the shared suite, in per-message mode
// (batch 1) or batch mode.
// With batchHandler the runner is built with NewBatch, its handler looping
// over the batch.
func transport(name string, batch int, batchHandler bool) adaptertest.Transport {
	return adaptertest.Transport{
		Name:     name,
		Features: adaptertest.Features{Poison: true, OrderedPerKey: true},
		New: func(t *testing.T, db *dbtest.DB) adaptertest.Instance {
			const topic = "suite"
			brokers := cluster(t, 4, topic).ListenAddrs()
			group := "suite-" + string(rune('a'+suiteGroups.Add(1)%26))
			w := newWriter(t, brokers, topic, 1)
			return adaptertest.Instance{
				Publish: func(ctx context.Context, id string, body []byte) error {
					return w.WriteMessages(ctx, msg(id, "", body))
				},
				PublishOrdered: func(ctx context.Context, orderKey, id string, body []byte) error {
					return w.WriteMessages(ctx, msg(id, orderKey, body))
				},
				Start:    start[pgx.Tx](brokers, group, topic, batch, batchHandler),
				StartSQL: start[*sql.Tx](brokers, group, topic, batch, batchHandler),
				Unacked: func(ctx context.Context) (int, error) {
					return groupLag(ctx, brokers, group, topic)
				},
			}
		},
	}
}

// start runs a Runner on the group whose handler, of the inbox driver's
// transaction type TTx, runs the suite's effect: per message (New), or over
// the batch (NewBatch) with batchHandler.
func start[TTx any](brokers []string, group, topic string, batch int, batchHandler bool) func(ctx context.Context, inbox *dedupe.Inbox, run adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
	return func(ctx context.Context, inbox *dedupe.Inbox, run adaptertest.RunConfig, effect adaptertest.TxEffect[TTx]) func() error {
		rc := readerConfig(brokers, group, topic)
		cfg := dedupekafka.Config{BatchSize: batch, MaxAttempts: run.MaxAttempts, RetryBackoff: 20 * time.Millisecond}
		h := func(ctx context.Context, tx TTx, m kafka.Message) error {
			return effect(ctx, tx, dedupekafka.KeyFromHeaders(m, dedupekafka.DefaultKeyHeaders...), m.Value)
		}
		var r *dedupekafka.Runner
		var err error
		if batchHandler {
			r, err = dedupekafka.NewBatch(inbox, rc, cfg, func(ctx context.Context, tx TTx, ms []kafka.Message) error {
				for _, m := range ms {
					if err := h(ctx, tx, m); err != nil {
						return err
					}
				}
				return nil
			})
		} else {
			r, err = dedupekafka.New(inbox, rc, cfg, h)
		}
		if err != nil {
			return func() error { return err }
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		return func() error { return <-done }
	}
}

func TestSuitePerMessage(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, transport("kafka-per-message", 1, false))
}

func TestSuiteBatch(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, transport("kafka-batch", 50, false))
}

func TestSuiteBatchHandler(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, transport("kafka-batch-handler", 50, true))
}
