package outbox

import (
	"context"
	"fmt"

	"github.com/exactlyonce/dedupe"
)

// A failed publish means one of two things: the message fails (a subject no
// stream captures, a topic that does not exist, a payload the broker
// refuses), or the broker is unreachable and every message would fail. The
// first must count toward the message's attempts, so that it is parked after
// them while the other keys flow; the second must count toward nothing, so
// that an outage of any length parks nothing, and the relay pauses instead.
//
// A cycle that confirmed some message saw the broker up: its failures are
// the messages'. A cycle that confirmed none asks the health check when
// there is one (RelayConfig.HealthCheck); without one, failures of two or
// more keys are an outage, and a single key's failure is that message's.

// HealthChecker is implemented by a Publisher that can tell whether its
// broker is reachable at all, independently of any message. The relay asks
// it when a cycle published nothing, to tell an outage from messages that
// fail; see RelayConfig.HealthCheck.
type HealthChecker interface {
	// CheckHealth returns nil when the broker accepts publishes, and an
	// error when it cannot be reached.
	CheckHealth(ctx context.Context) error
}

// judge splits a cycle's failures into those counted toward the messages'
// attempts (every Permanent one, and the others unless they are an outage)
// and those of an outage, which are not recorded.
func (r *Relay) judge(ctx context.Context, confirmed int, failures []failure) (counted, outage []failure) {
	var transient []failure
	for _, f := range failures {
		if dedupe.IsPermanent(f.err) {
			counted = append(counted, f)
		} else {
			transient = append(transient, f)
		}
	}
	if len(transient) > 0 && r.isOutage(ctx, confirmed, transient) {
		return counted, transient
	}
	return append(counted, transient...), nil
}

// isOutage decides whether the non-permanent failures of a cycle that
// confirmed confirmed messages are the broker's.
func (r *Relay) isOutage(ctx context.Context, confirmed int, transient []failure) bool {
	switch {
	case ctx.Err() != nil:
		return true // shutting down: the failures say nothing about the messages
	case confirmed > 0:
		return false
	case r.cfg.HealthCheck != nil:
		err := r.checkHealth(ctx)
		if err != nil {
			r.cfg.Logger.DebugContext(ctx, "dedupe: outbox relay health check failed", "err", err)
		}
		return err != nil
	}
	keys := map[orderKey]bool{}
	for _, f := range transient {
		k := orderKey{f.msg.Topic, f.msg.Key}
		if f.msg.Key == "" {
			k.key = "\x00" + f.msg.ID // an unkeyed message is a key of its own
		}
		keys[k] = true
	}
	return len(keys) > 1
}

// checkHealth calls the health check within PublishTimeout, turning a panic
// into an error.
func (r *Relay) checkHealth(ctx context.Context) (err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("dedupe: health check panicked: %v", v)
		}
	}()
	return r.cfg.HealthCheck(ctx)
}
