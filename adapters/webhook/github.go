package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"github.com/exactlyonce/dedupe"
)

// Headers of GitHub's webhooks.
const (
	GitHubSignatureHeader = "X-Hub-Signature-256"
	GitHubDeliveryHeader  = "X-GitHub-Delivery"
	GitHubEventHeader     = "X-GitHub-Event"
)

// GitHubConfig configures NewGitHub.
type GitHubConfig struct {
	// Secrets are the webhook's secrets; a delivery signed by any of them is
	// accepted, so list the old and the new one while rotating. Required.
	Secrets []string
	Config
}

// NewGitHub returns a Handler for GitHub's webhooks: it verifies
// X-Hub-Signature-256 (sha256=<hex>) over the raw body, then claims
// GitHubKey(body), the hash of the signed body, and runs h with the
// X-GitHub-Delivery id as Event.ID and the X-GitHub-Event type. GitHub signs
// no timestamp, so there is no tolerance. See New for the responses.
//
// The key is the body's hash, not the delivery id, because GitHub's
// signature covers the body only: anyone holding one signed delivery could
// replay it under fresh delivery ids, each a new key, and run its effects
// again and again; or send it under the id GitHub will give a later event,
// which would then be dropped as a duplicate. Keyed by the signed body, a
// replay under any headers is a duplicate, and headers decide nothing. A
// redelivery (GitHub's "Redeliver", manual or through the API) re-sends the
// same body, so it is a duplicate too, or processed if the first attempt
// failed.
//
// The trade-off: two distinct deliveries with byte-identical bodies are one
// event to the receiver; the second gets 200 "duplicate" and does not run.
// GitHub's payloads carry the ids, SHAs and timestamps of what they report,
// so distinct events practically never repeat a body; one that carries none
// (a "ping" can be such) may. Only keys within the inbox's Config.Retention
// merge, and that bounds the protection too: a replay of a body whose key
// was purged runs again, since GitHub signs no timestamp to refuse it by.
// Keep the retention (7 days by default) above the window in which a replay
// must not run, and above the one in which GitHub redelivers (3 days on
// github.com, 7 on GitHub Enterprise Server).
//
// The attempts and the failed state are counted on the same key, so a
// replay under a new delivery id cannot retry a failed event either; to let
// it run again, release GitHubKey(body) (the handler's error names the key).
//
// h receives the inbox driver's transaction: pgx.Tx, or *sql.Tx for an
// inbox over dedupe.SQL.
func NewGitHub[TTx any](inbox *dedupe.Inbox, cfg GitHubConfig, h dedupe.TxHandlerFunc[TTx, Event]) (*Handler, error) {
	return New(inbox, &GitHubVerifier{Secrets: cfg.Secrets}, cfg.Config, h)
}

// GitHubKeyPrefix starts every GitHub dedup key.
const GitHubKeyPrefix = "sha256:"

// GitHubKey returns the dedup key of a GitHub delivery: "sha256:" followed
// by the lower-case hex SHA-256 of its raw body, the only thing GitHub's
// signature covers. An operator computes it with `sha256sum` over the
// payload as delivered.
func GitHubKey(body []byte) string {
	sum := sha256.Sum256(body)
	return GitHubKeyPrefix + hex.EncodeToString(sum[:])
}

// GitHubVerifier verifies GitHub's X-Hub-Signature-256 header: an
// HMAC-SHA256 of the body under the webhook secret. The event's Key is
// GitHubKey(body); its ID is the unsigned X-GitHub-Delivery.
type GitHubVerifier struct {
	// Secrets are the accepted secrets. Required.
	Secrets []string
}

// Provider returns "github".
func (v *GitHubVerifier) Provider() string { return "github" }

func (v *GitHubVerifier) validate() error { return validateSecrets(v.Secrets) }

// ParseGitHubSignature parses an X-Hub-Signature-256 value
// ("sha256=<64 hex digits>", either case) into the MAC. It returns a
// *SignatureError.
func ParseGitHubSignature(header string) ([]byte, error) {
	bad := func(reason error, detail string) ([]byte, error) {
		return nil, &SignatureError{Provider: "github", Header: GitHubSignatureHeader, Reason: reason, Detail: detail}
	}
	header = strings.TrimSpace(header)
	if header == "" {
		return bad(ErrMissingSignature, "")
	}
	algo, digest, ok := strings.Cut(header, "=")
	if !ok || !strings.EqualFold(algo, "sha256") {
		return bad(ErrMalformedSignature, "want sha256=<hex>")
	}
	mac, err := hex.DecodeString(digest)
	if err != nil || len(mac) != sha256.Size {
		return bad(ErrMalformedSignature, "want 64 hex digits")
	}
	return mac, nil
}

// Verify implements Verifier.
func (v *GitHubVerifier) Verify(header http.Header, body []byte, _ time.Time) (Event, error) {
	if err := v.validate(); err != nil {
		return Event{}, err
	}
	mac, err := ParseGitHubSignature(header.Get(GitHubSignatureHeader))
	if err != nil {
		return Event{}, err
	}
	if err := checkMAC("github", GitHubSignatureHeader, sha256.New, v.Secrets, [][]byte{mac}, body); err != nil {
		return Event{}, err
	}
	// The delivery id is not signed: it is no part of the key, and it is
	// checked only so that handlers and logs get a usable one.
	id := strings.TrimSpace(header.Get(GitHubDeliveryHeader))
	if id == "" {
		return Event{}, &EventError{Provider: "github", Field: GitHubDeliveryHeader, Reason: "missing"}
	}
	if err := (dedupe.Key{Scope: "github", ID: id}).Validate(); err != nil {
		return Event{}, &EventError{Provider: "github", Field: GitHubDeliveryHeader, Reason: err.Error()}
	}
	return Event{ID: id, Key: GitHubKey(body), Type: strings.TrimSpace(header.Get(GitHubEventHeader))}, nil
}
