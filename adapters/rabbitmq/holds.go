package dedupeamqp

import (
	"context"
	"sync"
	"time"

	"github.com/exactlyonce/dedupe"
)

// holds are the deliveries the runner holds for a retry's delay before it
// requeues them (RabbitMQ has no delayed nack; see the package
// documentation). A held delivery occupies no worker.
type holds struct {
	mu      sync.Mutex
	m       map[*delivery]*time.Timer
	stopped bool
	wg      sync.WaitGroup
}

// reset readies h for a run.
func (h *holds) reset() {
	h.mu.Lock()
	h.m = map[*delivery]*time.Timer{}
	h.stopped = false
	h.mu.Unlock()
}

// requeueLater holds d for delay and then requeues it on its channel
// (EventRetried, with cause). A runner that is stopping requeues it at
// once.
func (r *Runner) requeueLater(ctx context.Context, d *delivery, cause error, delay time.Duration) {
	r.event(ctx, dedupe.EventRetried, d, cause, delay)
	h := &r.held
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		r.requeue(ctx, d)
		return
	}
	h.wg.Add(1)
	h.m[d] = time.AfterFunc(delay, func() {
		defer h.wg.Done()
		h.mu.Lock()
		_, ok := h.m[d]
		delete(h.m, d)
		h.mu.Unlock()
		if ok {
			r.requeue(context.WithoutCancel(ctx), d)
		}
	})
	h.mu.Unlock()
}

// releaseAll requeues every held delivery at once, and every one held from
// now on: the runner is stopping.
func (h *holds) releaseAll() {
	h.mu.Lock()
	h.stopped = true
	var now []*delivery
	for d, t := range h.m {
		if t.Stop() {
			h.wg.Done()
			now = append(now, d)
		}
		delete(h.m, d)
	}
	h.mu.Unlock()
	for _, d := range now {
		_ = d.sess.requeue(d.tag) // a dead channel's broker requeued it already
	}
}

// wait waits for the timers that fired to finish their requeue.
func (h *holds) wait() { h.wg.Wait() }

// requeue hands d back to the broker now (basic.nack requeue), unless its
// channel died (the broker requeued it then).
func (r *Runner) requeue(ctx context.Context, d *delivery) {
	if err := d.sess.requeue(d.tag); err != nil {
		r.cfg.Logger.DebugContext(ctx, "dedupeamqp: requeue", "queue", r.queue, "key", d.key.ID, "err", err)
	}
}
