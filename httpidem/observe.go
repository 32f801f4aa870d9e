package httpidem

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/exactlyonce/dedupe"
)

// messageInfo is what the inbox's Observer is told of a request: its route
// (the ServeMux pattern when the middleware runs inside one, else the
// method), its idempotency key and its headers, which carry the caller's
// trace context, untrusted unless the middleware trusts its callers
// (Config.TrustCallers).
func messageInfo(r *http.Request, id string, trusted bool) dedupe.MessageInfo {
	dest := r.Pattern
	if dest == "" {
		dest = r.Method
	}
	return dedupe.MessageInfo{System: "http", Destination: dest, ID: id, Partition: -1, Offset: -1,
		Headers: dedupe.MapHeaders(r.Header), Untrusted: !trusted}
}

// observe starts observing a request's handling with the inbox's Observer.
// In leased mode the core observes (Begin, then Complete or Fail), so it
// only puts the request's MessageInfo in the context; in transactional mode,
// where the claim is a statement of the request's transaction, the
// middleware reports the handling itself, as the core reports a leased one:
// done is called once, with the claim and, when the key was not settled
// with a stored answer (released for a retry, or its commit's outcome
// unknown), the reason. A claim with such an error is reported as
// OutcomeRetry (or OutcomeUnknown); an error answer stored as the key's final
// answer is a claimed handling without error, as Complete reports it.
func (m *Middleware) observe(ctx context.Context, r *http.Request, key dedupe.Key) (context.Context, func(*dedupe.Claim, error)) {
	obs := m.cfg.Inbox.Observer
	if obs == nil || key.Validate() != nil {
		// An invalid key (a tenant the inbox refuses) is answered before any
		// claim, as the core's Begin refuses it before observing.
		return ctx, func(*dedupe.Claim, error) {}
	}
	info := messageInfo(r, key.ID, m.cfg.TrustCallers)
	if m.mode != Transactional {
		return dedupe.WithMessageInfo(ctx, info), func(*dedupe.Claim, error) {}
	}
	start := time.Now()
	ctx, done := obs.StartHandle(ctx, dedupe.HandleInfo{Key: key, Mode: "transactional", Message: info})
	return ctx, func(c *dedupe.Claim, err error) {
		d := dedupe.HandleDone{Err: err, Duration: time.Since(start)}
		switch {
		case c != nil:
			d.Outcome, d.Attempt = c.Outcome, c.Attempt
			switch {
			case d.Err == nil:
				d.Err = c.Outcome.Err()
			case c.Outcome == dedupe.OutcomeClaimed && errors.Is(d.Err, dedupe.ErrOutcomeUnknown):
				d.Outcome = dedupe.OutcomeUnknown
			case c.Outcome == dedupe.OutcomeClaimed:
				d.Outcome = dedupe.OutcomeRetry
			}
		case errors.Is(err, dedupe.ErrInFlight):
			d.Outcome = dedupe.OutcomeInFlight
		}
		done(d)
	}
}
