package dedupenats

import (
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// heartbeat keeps every message the runner holds alive: the messages
// fetched and waiting for a worker, the ones being handled, and the ones held
// while the database is unreachable or while the runner tries to record them
// at their last delivery. One timer serves them all; it runs only while some
// message is held. Each held message is marked in progress at least once per
// interval, so its AckWait never expires while the runner still has it, even
// when it waits in the buffer behind slow handlers.
type heartbeat struct {
	interval time.Duration
	logger   *slog.Logger

	mu    sync.Mutex
	held  map[jetstream.Msg]time.Time // message → when it was received or last marked in progress
	timer *time.Timer
	armed bool
	freed chan struct{} // signalled (without blocking) when a message is let go
}

func newHeartbeat(interval time.Duration, logger *slog.Logger) *heartbeat {
	return &heartbeat{
		interval: interval,
		logger:   logger,
		held:     make(map[jetstream.Msg]time.Time),
		freed:    make(chan struct{}, 1),
	}
}

// hold starts keeping msg alive; holding a held message again is a no-op.
func (h *heartbeat) hold(msg jetstream.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.held[msg]; ok {
		return
	}
	h.held[msg] = time.Now()
	h.arm()
}

// let stops keeping msg alive. It is called before the message's final
// acknowledgement (Ack, Nak or Term), and once it returns no InProgress is
// sent for msg any more: a late one would postpone a Nak's redelivery.
func (h *heartbeat) let(msg jetstream.Msg) {
	h.mu.Lock()
	delete(h.held, msg)
	if len(h.held) == 0 && h.armed {
		h.timer.Stop()
		h.armed = false
	}
	h.mu.Unlock()
	select {
	case h.freed <- struct{}{}:
	default:
	}
}

// count is the number of messages held.
func (h *heartbeat) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

// arm schedules the next beat unless one is scheduled. h.mu is held.
func (h *heartbeat) arm() {
	if h.armed {
		return
	}
	h.armed = true
	if h.timer == nil {
		h.timer = time.AfterFunc(h.interval/2, h.beat)
		return
	}
	h.timer.Reset(h.interval / 2)
}

// beat marks in progress every held message that has not been for half an
// interval. It ticks every half interval, so no message goes longer than one
// interval without it. The lock is held while sending, so that let really is
// the end of the beats for a message.
func (h *heartbeat) beat() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = false
	now := time.Now()
	for msg, last := range h.held {
		if now.Sub(last) < h.interval/2 {
			continue
		}
		h.held[msg] = now
		if err := msg.InProgress(); err != nil {
			h.logger.Debug("dedupenats: in progress", "subject", msg.Subject(), "err", err)
		}
	}
	if len(h.held) > 0 {
		h.arm()
	}
}
