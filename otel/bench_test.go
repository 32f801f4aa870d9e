package dedupeotel_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
	dedupeotel "github.com/exactlyonce/dedupe/otel"
)

// discard is a span processor that drops every span: the SDK records the
// spans (they are sampled) and nothing is exported, so the benchmarks
// measure the observer and the SDK, not an exporter.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }

// sdkObserver is a dedupeotel Observer on the SDK, every span sampled and
// recorded, the metrics aggregated by a manual reader.
func sdkObserver(b *testing.B) *dedupeotel.Observer {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discard{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	obs, err := dedupeotel.New(dedupeotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	return obs
}

// traceHeaders are a message's headers carrying a producer's trace context.
func traceHeaders() dedupe.MapHeaders {
	headers := dedupe.MapHeaders{}
	ctx, span := sdktrace.NewTracerProvider().Tracer("p").Start(context.Background(), "producer")
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(headers))
	span.End()
	return headers
}

// BenchmarkObserver is the CPU cost per message of the observer alone: one
// StartHandle and its done, for a message whose headers carry a trace
// context, with NopObserver, with dedupeotel on the global no-op providers
// (no SDK installed), and with dedupeotel on the SDK.
//
//	go test -run '^$' -bench BenchmarkObserver -benchmem ./otel
func BenchmarkObserver(b *testing.B) {
	headers := traceHeaders()
	info := dedupe.HandleInfo{Key: dedupe.Key{Scope: "billing", ID: "order-1"}, Mode: "transactional",
		Message: dedupe.MessageInfo{System: "nats", Destination: "orders.created", ID: "m-1", Group: "billing",
			Partition: -1, Offset: -1, Delivery: 1, Headers: headers}}
	noop, err := dedupeotel.New(dedupeotel.Config{})
	if err != nil {
		b.Fatal(err)
	}
	for name, obs := range map[string]dedupe.Observer{"nop": dedupe.NopObserver{}, "otel-noop-providers": noop, "otel-sdk": sdkObserver(b)} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, done := obs.StartHandle(context.Background(), info)
				done(dedupe.HandleDone{Outcome: dedupe.OutcomeClaimed, Attempt: 1, Duration: time.Millisecond})
			}
		})
	}
}

// BenchmarkConsumerHandle measures Consumer.Handle (claim and one effect row
// in one transaction, on PostgreSQL) with no observer, with NopObserver (the
// core's own cost of an observer) and with the dedupeotel Observer on the
// SDK, interleaved message by message (the order rotating) so that all see
// the same machine. Per round of 100 messages it takes each one's time over
// the time without an observer, and reports the min and median ratio and
// the median added time per message.
//
//	go test -run '^$' -bench BenchmarkConsumerHandle -benchtime 3000x ./otel
func BenchmarkConsumerHandle(b *testing.B) {
	db := dbtest.New(b)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, db.Pool, dedupe.MigrateConfig{}); err != nil {
		b.Fatal(err)
	}
	db.Exec(b, `CREATE TABLE effects (id bigserial PRIMARY KEY, msg_key text NOT NULL)`)
	headers := traceHeaders()
	consumer := func(obs dedupe.Observer) *dedupe.Consumer[delivery] {
		inbox, err := dedupe.New(db.Pool, dedupe.Config{Observer: obs})
		if err != nil {
			b.Fatal(err)
		}
		c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[delivery]{
			Scope: "billing", Key: func(d delivery) (string, error) { return d.ID, nil },
			Describe: func(d delivery) dedupe.MessageInfo { // what an adapter's costs: no formatting
				return dedupe.MessageInfo{System: "nats", Destination: "orders.created", ID: d.ID, Group: "billing",
					Partition: -1, Offset: -1, Delivery: d.Delivery, Headers: headers}
			},
		}, insertEffect)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	arms := []struct {
		name string
		c    *dedupe.Consumer[delivery]
	}{{"nil", consumer(nil)}, {"nop", consumer(dedupe.NopObserver{})}, {"otel", consumer(sdkObserver(b))}}
	const round = 100
	var (
		total  [3]time.Duration
		ratios [3][]float64 // [arm] per round, over nil
		added  [3][]float64 // µs per message over nil
	)
	n := 0
	for b.Loop() {
		n++
		for k := range arms {
			a := arms[(n+k)%len(arms)]
			i := (n + k) % len(arms)
			start := time.Now()
			if _, err := a.c.Handle(ctx, delivery{ID: fmt.Sprintf("%s-%d", a.name, n), Delivery: 1}); err != nil {
				b.Fatal(err)
			}
			total[i] += time.Since(start)
		}
		if n%round == 0 {
			for i := range arms {
				ratios[i] = append(ratios[i], float64(total[i])/float64(total[0]))
				added[i] = append(added[i], float64(total[i]-total[0])/round/float64(time.Microsecond))
			}
			total = [3]time.Duration{}
		}
	}
	if len(ratios[0]) == 0 {
		return
	}
	med := func(s []float64) float64 { return s[len(s)/2] }
	for i := 1; i < len(arms); i++ {
		slices.Sort(ratios[i])
		slices.Sort(added[i])
		b.ReportMetric(ratios[i][0], arms[i].name+"-min-ratio")
		b.ReportMetric(med(ratios[i]), arms[i].name+"-median-ratio")
		b.ReportMetric(med(added[i]), arms[i].name+"-added-µs/msg")
		b.Logf("Consumer.Handle with the %s observer / without, %d rounds of %d: min %.3f, median %.3f; median added %.1fµs per message",
			arms[i].name, len(ratios[i]), round, ratios[i][0], med(ratios[i]), med(added[i]))
	}
}
