// Package webhook receives provider webhooks (Stripe, GitHub, Standard
// Webhooks such as Svix, or any HMAC-signed sender) and runs the caller's
// handler exactly once per event, however often the provider re-sends it.
//
// Providers deliver at least once: they re-send on any non-2xx answer or
// timeout, and sometimes twice in parallel. Each constructor returns an
// http.Handler that
//
//  1. refuses anything but POST (405) and a body over the limit (413,
//     default 1 MiB, without reading it all);
//  2. verifies the signature over the raw body before parsing anything,
//     comparing MACs in constant time, accepting several secrets (rotation)
//     and, where the provider signs a timestamp, refusing one more than the
//     tolerance (default 5 minutes) away: 400 with a short reason and no
//     database work;
//  3. claims the event id in the dedupe inbox inside the transaction that
//     runs the handler, so that the claim and the handler's writes commit
//     together. The scope is "webhook:<provider>:<endpoint>".
//
// A processed event and a duplicate both get 200, so the provider stops. A
// failed handler gets 500 and rolls back with its claim, so the provider's
// retry runs it again. A duplicate that arrives while the first delivery is
// still in its transaction waits up to Config.LockTimeout, then gets 503
// with Retry-After; see New for the reasoning and the full table.
//
// Every refusal is a typed error (see error.go), passed to Config.OnError
// and matched with errors.Is and errors.As.
package webhook
