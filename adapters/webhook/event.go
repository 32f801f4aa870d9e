package webhook

import (
	"encoding/json"
	"net/http"
	"time"
)

// Event is one authenticated delivery, as the handler receives it. The body
// has been verified against the provider's signature before anything parsed
// it.
type Event struct {
	// Provider is the verifier's name: "stripe", "github", "standard" or the
	// generic receiver's Name.
	Provider string
	// Endpoint is Config.Endpoint.
	Endpoint string
	// ID is the provider's event (or delivery) id. Every re-send of the
	// event carries the same id. It is covered by the signature for Stripe,
	// Standard Webhooks and the generic receiver, where it is also the
	// dedup key; GitHub's X-GitHub-Delivery is not, so it is informational
	// only (see Key).
	ID string
	// Key is the dedup key claimed for the event, taken only from what the
	// signature covers: ID where the signature covers it, GitHubKey(Body)
	// for GitHub. A custom Verifier may leave it empty; ID is then the key,
	// and must be covered by its signature.
	Key string
	// Type is the event type ("invoice.paid", "push"), or "" when the
	// provider does not say. GitHub's X-GitHub-Event and a generic
	// TypeHeader are not covered by the signature.
	Type string
	// Timestamp is the signed send time, or the zero time for providers
	// that sign none (GitHub).
	Timestamp time.Time
	// Header is the request's header. Only what the provider's signature
	// covers is authenticated.
	Header http.Header
	// Body is the raw, verified request body.
	Body []byte
}

// key returns the dedup key: Key, or ID when Key is empty.
func (e Event) key() string {
	if e.Key != "" {
		return e.Key
	}
	return e.ID
}

// Decode unmarshals the JSON body into v.
func (e Event) Decode(v any) error { return json.Unmarshal(e.Body, v) }

// Scope returns the dedup scope of a provider's endpoint,
// "webhook:<provider>:<endpoint>": two endpoints never share keys, and
// operators find an endpoint's rows by it.
func Scope(provider, endpoint string) string { return "webhook:" + provider + ":" + endpoint }
