package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// delivery is one delivery of one input: the broker hands it to a consumer
// and expects an ack (processed, or found to be a duplicate) or a nack
// (failed; deliver again).
type delivery struct {
	seq int64  // the delivery's number, unique per broker
	id  string // the message's dedup key, the same for every redelivery
}

// broker is an in-memory at-least-once queue, the soak's stand-in for a
// message broker where a transport has none: every input is delivered until
// a consumer acknowledges it, a nack redelivers after a delay, and with
// probability redeliverRate an acknowledged message is delivered once more
// (the broker lost the ack), as real brokers do.
type broker struct {
	queue        chan delivery
	urgent       chan delivery // delivered before the queue
	redelivery   time.Duration
	faults       *faults
	maxRedeliver int
	mu           sync.Mutex
	seq          int64
	outstanding  int            // deliveries not yet acknowledged
	held         map[int64]bool // deliveries handed out and not yet settled
	redelivered  int            // acknowledged messages delivered again
	done         chan struct{}  // closed when outstanding reaches zero
	closed       bool
	timers       sync.WaitGroup
	acks         *atomic.Int64 // counts acknowledgements, the run's progress
}

func newBroker(inputs []string, f *faults, redelivery time.Duration, acks *atomic.Int64) *broker {
	b := &broker{
		acks: acks,
		// Every message is in the queue at most once at a time, plus the
		// injected redeliveries, which are capped at len(inputs).
		queue:        make(chan delivery, 2*len(inputs)+1),
		urgent:       make(chan delivery, len(inputs)+1),
		redelivery:   redelivery,
		faults:       f,
		maxRedeliver: len(inputs),
		held:         map[int64]bool{},
		done:         make(chan struct{}),
	}
	for _, id := range inputs {
		b.push(id)
	}
	if len(inputs) == 0 {
		close(b.done)
		b.closed = true
	}
	return b
}

// push enqueues a new delivery of id that must be acknowledged.
func (b *broker) push(id string) {
	b.mu.Lock()
	b.seq++
	d := delivery{seq: b.seq, id: id}
	b.outstanding++
	b.mu.Unlock()
	b.queue <- d
}

// pushUrgent enqueues a new delivery of id that the next consumer to ask
// gets, before the queue: a redelivery that must arrive while the first
// delivery is still being handled. At most as many as there are inputs are
// taken; more are dropped.
func (b *broker) pushUrgent(id string) {
	b.mu.Lock()
	if len(b.urgent) == cap(b.urgent) {
		b.mu.Unlock()
		return
	}
	b.seq++
	d := delivery{seq: b.seq, id: id}
	b.outstanding++
	b.urgent <- d
	b.mu.Unlock()
}

// next returns the next delivery, or false when ctx ends or every delivery
// was acknowledged.
func (b *broker) next(ctx context.Context) (delivery, bool) {
	select {
	case d := <-b.urgent:
		return b.hold(d), true
	default:
	}
	select {
	case d := <-b.urgent:
		return b.hold(d), true
	case d := <-b.queue:
		return b.hold(d), true
	case <-b.done:
		return delivery{}, false
	case <-ctx.Done():
		return delivery{}, false
	}
}

// ack settles d as processed. With the redelivery fault the broker then
// delivers the same message once more, as if the ack had been lost.
func (b *broker) ack(d delivery) {
	b.mu.Lock()
	if !b.held[d.seq] {
		b.mu.Unlock()
		return
	}
	delete(b.held, d.seq)
	b.acks.Add(1)
	again := b.redelivered < b.maxRedeliver && b.faults.hit(faultRedeliver)
	if again {
		b.redelivered++
	}
	b.outstanding--
	if again {
		b.seq++
		b.outstanding++
		nd := delivery{seq: b.seq, id: d.id}
		b.mu.Unlock()
		b.queue <- nd
		return
	}
	finished := b.outstanding == 0 && !b.closed
	if finished {
		b.closed = true
	}
	b.mu.Unlock()
	if finished {
		close(b.done)
	}
}

// nack settles d as failed: it is delivered again after the redelivery
// delay.
func (b *broker) nack(d delivery) {
	b.mu.Lock()
	if !b.held[d.seq] {
		b.mu.Unlock()
		return
	}
	delete(b.held, d.seq)
	b.timers.Add(1)
	b.mu.Unlock()
	time.AfterFunc(b.redelivery, func() {
		defer b.timers.Done()
		b.queue <- d
	})
}

// wait blocks until every delivery was acknowledged or ctx ends, and then
// until no redelivery timer is pending.
func (b *broker) wait(ctx context.Context) error {
	defer b.timers.Wait()
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// left reports how many deliveries are not acknowledged.
func (b *broker) left() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.outstanding
}

// tryNext returns a queued delivery without waiting, or false.
func (b *broker) tryNext() (delivery, bool) {
	select {
	case d := <-b.urgent:
		return b.hold(d), true
	case d := <-b.queue:
		return b.hold(d), true
	default:
		return delivery{}, false
	}
}

// hold records d as handed out, to be settled by ack or nack.
func (b *broker) hold(d delivery) delivery {
	b.mu.Lock()
	b.held[d.seq] = true
	b.mu.Unlock()
	return d
}
