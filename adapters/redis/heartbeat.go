package deduperedis

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// heartbeatChunk bounds the ids of one XCLAIM.
const heartbeatChunk = 256

// heartbeat keeps the entries a runner holds from going idle in the group's
// pending list: every Config.Heartbeat it claims them again for its own
// consumer with XCLAIM … JUSTID, which resets their idle time without
// counting a delivery, so that no other consumer reclaims an entry that is
// being handled, waiting for a retry, or held through a database outage.
type heartbeat struct {
	r    *Runner
	mu   sync.Mutex
	held map[string]int // entry id → holders
}

func newHeartbeat(r *Runner) *heartbeat { return &heartbeat{r: r, held: map[string]int{}} }

func (h *heartbeat) hold(id string) {
	h.mu.Lock()
	h.held[id]++
	h.mu.Unlock()
}

func (h *heartbeat) let(id string) {
	h.mu.Lock()
	if h.held[id]--; h.held[id] <= 0 {
		delete(h.held, id)
	}
	h.mu.Unlock()
}

func (h *heartbeat) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

// run beats until ctx is done.
func (h *heartbeat) run(ctx context.Context) {
	t := time.NewTicker(h.r.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.beat(ctx)
		}
	}
}

// beat resets the idle time of every held entry.
func (h *heartbeat) beat(ctx context.Context) {
	h.mu.Lock()
	ids := make([]string, 0, len(h.held))
	for id := range h.held {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	r := h.r
	for len(ids) > 0 {
		n := min(len(ids), heartbeatChunk)
		bctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
		err := r.rdb.XClaimJustID(bctx, &redis.XClaimArgs{
			Stream: r.stream, Group: r.group, Consumer: r.cfg.Consumer, Messages: ids[:n],
		}).Err()
		cancel()
		if err != nil && ctx.Err() == nil {
			// The entries may go idle and be reclaimed by another consumer;
			// the inbox absorbs the second handling.
			r.cfg.Logger.WarnContext(ctx, "deduperedis: heartbeat", "stream", r.stream, "entries", n, "err", err)
		}
		ids = ids[n:]
	}
}
