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
// X-Hub-Signature-256 (sha256=<hex>) over the raw body, then claims the
// X-GitHub-Delivery id (which a redelivery keeps) and runs h with the
// X-GitHub-Event type. GitHub signs no timestamp, so there is no tolerance.
// See New for the responses.
func NewGitHub(inbox *dedupe.Inbox, cfg GitHubConfig, h dedupe.HandlerFunc[Event]) (*Handler, error) {
	return New(inbox, &GitHubVerifier{Secrets: cfg.Secrets}, cfg.Config, h)
}

// GitHubVerifier verifies GitHub's X-Hub-Signature-256 header: an
// HMAC-SHA256 of the body under the webhook secret.
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
	id := strings.TrimSpace(header.Get(GitHubDeliveryHeader))
	if id == "" {
		return Event{}, &EventError{Provider: "github", Field: GitHubDeliveryHeader, Reason: "missing"}
	}
	return Event{ID: id, Type: strings.TrimSpace(header.Get(GitHubEventHeader))}, nil
}
