package dedupeotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// ErrClosed is returned by ObserveStats after Close.
var ErrClosed = errors.New("dedupeotel: observer closed")

// ObserveStats feeds the gauges from inbox's Stats (dedupe.keys,
// dedupe.keys.oldest_in_flight.age) and outbox's Stats (dedupe.outbox.*),
// queried at every metrics collection, each query bounded by
// Config.StatsTimeout; either may be nil. Stats reads the whole inbox
// table: keep the collection interval in minutes for a large inbox. Once an
// outbox is observed this way, the relay's OutboxQueued reports no longer
// feed the outbox gauges. Stop with the returned function, or Close.
func (o *Observer) ObserveStats(inbox *dedupe.Inbox, ob *outbox.Outbox) (stop func() error, err error) {
	var insts []metric.Observable
	if inbox != nil {
		insts = append(insts, o.m.keys, o.m.oldestInFlight)
	}
	var table attribute.KeyValue
	if ob != nil {
		insts = append(insts, o.m.outboxPending, o.m.outboxParked, o.m.outboxOldest)
		c := ob.Config()
		name := c.Table
		if c.Schema != "" {
			name = c.Schema + "." + name
		}
		table = OutboxTableKey.String(name)
	}
	if len(insts) == 0 {
		return func() error { return nil }, nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.close {
		return nil, ErrClosed
	}
	reg, err := o.meter.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, o.cfg.StatsTimeout)
		defer cancel()
		var errs []error
		if inbox != nil {
			errs = append(errs, o.observeInbox(ctx, obs, inbox))
		}
		if ob != nil {
			s, err := ob.Stats(ctx)
			if err == nil {
				observeOutbox(obs, &o.m, s, metric.WithAttributes(table))
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}, insts...)
	if err != nil {
		return nil, err
	}
	o.regs = append(o.regs, reg)
	if ob != nil {
		o.outboxWatched.Add(1)
	}
	var once bool
	return func() error {
		o.mu.Lock()
		defer o.mu.Unlock()
		if once {
			return nil
		}
		once = true
		if ob != nil {
			o.outboxWatched.Add(-1)
		}
		return reg.Unregister()
	}, nil
}

// observeInbox observes the inbox gauges from inbox.Stats.
func (o *Observer) observeInbox(ctx context.Context, obs metric.Observer, inbox *dedupe.Inbox) error {
	stats, err := inbox.Stats(ctx)
	if err != nil {
		return err
	}
	for _, s := range stats {
		obs.ObserveInt64(o.m.keys, s.Count, metric.WithAttributes(ScopeKey.String(s.Scope), StateKey.String(string(s.State))))
		if s.State == dedupe.StateInFlight {
			obs.ObserveFloat64(o.m.oldestInFlight, s.OldestInFlightAge.Seconds(), metric.WithAttributes(ScopeKey.String(s.Scope)))
		}
	}
	return nil
}

// observeQueued observes the outbox gauges from the relay's last report,
// unless ObserveStats reads an outbox.
func (o *Observer) observeQueued(_ context.Context, obs metric.Observer) error {
	if o.outboxWatched.Load() > 0 {
		return nil
	}
	if s := o.queued.Load(); s != nil {
		observeOutbox(obs, &o.m, *s)
	}
	return nil
}

func observeOutbox(obs metric.Observer, m *instruments, s outbox.Stats, opts ...metric.ObserveOption) {
	obs.ObserveInt64(m.outboxPending, s.Pending, opts...)
	obs.ObserveInt64(m.outboxParked, s.Parked, opts...)
	obs.ObserveFloat64(m.outboxOldest, s.OldestPending.Seconds(), opts...)
}
