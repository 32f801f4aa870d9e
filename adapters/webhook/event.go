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
	// ID is the provider's event (or delivery) id: the dedup key. Every
	// re-send of the event carries the same id.
	ID string
	// Type is the event type ("invoice.paid", "push"), or "" when the
	// provider does not say.
	Type string
	// Timestamp is the signed send time, or the zero time for providers
	// that sign none (GitHub).
	Timestamp time.Time
	// Header is the request's header.
	Header http.Header
	// Body is the raw, verified request body.
	Body []byte
}

// Decode unmarshals the JSON body into v.
func (e Event) Decode(v any) error { return json.Unmarshal(e.Body, v) }

// Scope returns the dedup scope of a provider's endpoint,
// "webhook:<provider>:<endpoint>": two endpoints never share keys, and
// operators find an endpoint's rows by it.
func Scope(provider, endpoint string) string { return "webhook:" + provider + ":" + endpoint }
