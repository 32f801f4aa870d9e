package dedupeotel

import (
	"errors"

	"go.opentelemetry.io/otel/metric"
)

// instruments are the Observer's metric instruments (see New).
type instruments struct {
	claims         metric.Int64Counter
	handleDuration metric.Float64Histogram

	keys           metric.Int64ObservableGauge
	oldestInFlight metric.Float64ObservableGauge

	leaseRenewals metric.Int64Counter
	leaseLost     metric.Int64Counter
	purgeDeleted  metric.Int64Counter
	purges        metric.Int64Counter

	enqueued      metric.Int64Counter
	publishes     metric.Int64Counter
	publishLag    metric.Float64Histogram
	discarded     metric.Int64Counter
	outboxPending metric.Int64ObservableGauge
	outboxParked  metric.Int64ObservableGauge
	outboxOldest  metric.Float64ObservableGauge

	transportEvents metric.Int64Counter
}

// Bucket boundaries, in seconds: a handling takes milliseconds to seconds;
// the lag from enqueue to publish milliseconds to minutes (an outage).
var (
	handleBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	lagBuckets    = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

func newInstruments(m metric.Meter) (instruments, error) {
	var (
		in   instruments
		errs []error
	)
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	in.claims = counter("dedupe.claims", "{message}", "Message handlings by outcome.")
	in.leaseRenewals = counter("dedupe.lease.renewals", "{renewal}", "Lease renewals by KeepAlive, by result.")
	in.leaseLost = counter("dedupe.lease.lost", "{lease}", "Leases KeepAlive gave up on.")
	in.purgeDeleted = counter("dedupe.purge.deleted", "{key}", "Keys deleted by purges.")
	in.purges = counter("dedupe.purges", "{purge}", "Purges, by result.")
	in.enqueued = counter("dedupe.outbox.enqueued", "{message}", "Messages enqueued in the outbox.")
	in.publishes = counter("dedupe.outbox.publishes", "{message}", "Relay publishes by outcome.")
	in.discarded = counter("dedupe.outbox.discarded", "{message}", "Outbox messages discarded by an operator.")
	in.transportEvents = counter("dedupe.transport.events", "{event}", "What the transport adapters did beyond the claim, by event.")

	var err error
	in.handleDuration, err = m.Float64Histogram("dedupe.handle.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a message's handling, commit included."),
		metric.WithExplicitBucketBoundaries(handleBuckets...))
	errs = append(errs, err)
	in.publishLag, err = m.Float64Histogram("dedupe.outbox.publish.lag", metric.WithUnit("s"),
		metric.WithDescription("Time from a message's enqueue to the broker's confirmation, on the database's clock."),
		metric.WithExplicitBucketBoundaries(lagBuckets...))
	errs = append(errs, err)

	in.keys, err = m.Int64ObservableGauge("dedupe.keys", metric.WithUnit("{key}"),
		metric.WithDescription("Keys in the inbox by scope and state."))
	errs = append(errs, err)
	in.oldestInFlight, err = m.Float64ObservableGauge("dedupe.keys.oldest_in_flight.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest in-flight key, by scope."))
	errs = append(errs, err)
	in.outboxPending, err = m.Int64ObservableGauge("dedupe.outbox.pending", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages waiting to be published, retries included."))
	errs = append(errs, err)
	in.outboxParked, err = m.Int64ObservableGauge("dedupe.outbox.parked", metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages parked until an operator unparks or discards them."))
	errs = append(errs, err)
	in.outboxOldest, err = m.Float64ObservableGauge("dedupe.outbox.oldest_pending.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest pending outbox message, on the database's clock."))
	errs = append(errs, err)
	return in, errors.Join(errs...)
}
