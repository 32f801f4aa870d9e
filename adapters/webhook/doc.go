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
//  3. claims the event's dedup key (Event.Key) in the dedupe inbox inside
//     the transaction that runs the handler, so that the claim and the
//     handler's writes commit together. The scope is
//     "webhook:<provider>:<endpoint>".
//
// The key comes only from what the signature covers, never from an unsigned
// header, so that a signed delivery produces its effects at most once
// whatever headers come with it, and nobody can make another event a
// duplicate:
//
//   - Stripe: the "id" of the JSON body, which the signature ("<t>.<body>")
//     covers.
//   - Standard Webhooks (Svix): webhook-id, which the signature
//     ("<id>.<timestamp>.<body>") covers.
//   - Generic HMAC: a field of the verified JSON body (IDField), or an id
//     header that HMACVerifier.SignedContent covers with {id}; an IDHeader
//     the signature does not cover is refused by New with a *dedupe.ConfigError.
//   - GitHub: GitHubKey(body), "sha256:" and the hex SHA-256 of the body,
//     because the signature covers the body only: X-GitHub-Delivery is not
//     signed and is Event.ID for logs alone. Two deliveries with
//     byte-identical bodies are then one event, within the inbox's
//     retention; see NewGitHub for the trade-off.
//
// One signed event is one key: an id in a JSON body is read by its exact
// field name (never a field that differs in case, as encoding/json's
// decoding into a struct would match), and a body whose id field is
// repeated, or whose id is not valid UTF-8 (invalid bytes, or a lone
// surrogate escape, which encoding/json would turn into U+FFFD so that two
// events shared one key), is refused with 400 and an *EventError naming the
// field and the reason.
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
