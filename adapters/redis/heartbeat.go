package deduperedis

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// heartbeatChunk bounds the ids of one XCLAIM.
const heartbeatChunk = 256

// keepAlive claims again, with XCLAIM … JUSTID to the consumer ARGV[2] of
// the group ARGV[1], the ids ARGV[3:] of stream KEYS[1] whose entries still
// exist. Redis 7's XCLAIM deletes from the pending list an entry whose body
// was trimmed away: claiming it blindly would erase the only trace of an
// entry still being handled, and a stop or a crash before it settles would
// then lose it without a record. A trimmed entry is left to go idle, to be
// reclaimed (XAUTOCLAIM) and reported as trimmed.
var keepAlive = redis.NewScript(`
local live = {}
for i = 3, #ARGV do
  if #redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i]) > 0 then
    live[#live + 1] = ARGV[i]
  end
end
local n = #live
if n > 0 then
  live[n + 1] = 'JUSTID'
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, unpack(live))
end
return n
`)

// heartbeat keeps the entries a runner holds from going idle in the group's
// pending list: every Config.Heartbeat it claims them again for its own
// consumer with XCLAIM … JUSTID (through keepAlive, which spares the entries
// trimmed away), which resets their idle time without counting a delivery,
// so that no other consumer reclaims an entry that is being handled,
// waiting for a retry, or held through a database outage.
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
		args := make([]any, 0, n+2)
		args = append(args, r.group, r.cfg.Consumer)
		for _, id := range ids[:n] {
			args = append(args, id)
		}
		err := keepAlive.Run(bctx, r.rdb, []string{r.stream}, args...).Err()
		cancel()
		if err != nil && ctx.Err() == nil {
			// The entries may go idle and be reclaimed by another consumer;
			// the inbox absorbs the second handling.
			r.cfg.Logger.WarnContext(ctx, "deduperedis: heartbeat", "stream", r.stream, "entries", n, "err", err)
		}
		ids = ids[n:]
	}
}
