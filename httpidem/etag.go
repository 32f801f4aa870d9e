package httpidem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/exactlyonce/dedupe"
	"github.com/jackc/pgx/v5"
)

// ETag returns the strong entity tag of a row version, e.g. `"7"`.
func ETag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// SetETag sets the response's ETag header to the tag of version.
func SetETag(w http.ResponseWriter, version int64) { w.Header().Set("ETag", ETag(version)) }

// IfMatch is a parsed If-Match header.
type IfMatch struct {
	Present  bool    // the request has an If-Match header
	Any      bool    // If-Match: *
	Versions []int64 // the versions named by strong tags
}

// ParseIfMatch reads the If-Match header of h. Weak tags (W/"…") and tags
// that are not versions never match (RFC 9110 §13.1.1 uses the strong
// comparison), so they are dropped.
func ParseIfMatch(h http.Header) IfMatch {
	vals := h.Values("If-Match")
	m := IfMatch{Present: len(vals) > 0}
	for _, v := range vals {
		for tag := range strings.SplitSeq(v, ",") {
			tag = strings.TrimSpace(tag)
			if tag == "*" {
				m.Any = true
				continue
			}
			if len(tag) < 2 || tag[0] != '"' || tag[len(tag)-1] != '"' {
				continue
			}
			if n, err := strconv.ParseInt(tag[1:len(tag)-1], 10, 64); err == nil {
				m.Versions = append(m.Versions, n)
			}
		}
	}
	return m
}

// Matches reports whether the header accepts the current version.
func (m IfMatch) Matches(version int64) bool {
	if m.Any {
		return true
	}
	for _, v := range m.Versions {
		if v == version {
			return true
		}
	}
	return false
}

// CheckIfMatch checks r's If-Match against the current version: nil when it
// matches (or is absent and not required), ErrPreconditionRequired (428)
// when absent and required, ErrPreconditionFailed (412) when stale. Check
// and write in one statement with Versioned.Update to avoid a race between
// the check and the write.
func CheckIfMatch(r *http.Request, current int64, required bool) error {
	m := ParseIfMatch(r.Header)
	switch {
	case !m.Present && required:
		return newError(http.StatusPreconditionRequired, ErrPreconditionRequired, "", nil)
	case m.Present && !m.Matches(current):
		return staleError(current)
	}
	return nil
}

// NotModified answers 304 and reports true when r's If-None-Match names
// version (or is *), for GET and HEAD handlers; the ETag header is set
// either way.
func NotModified(w http.ResponseWriter, r *http.Request, version int64) bool {
	SetETag(w, version)
	inm := r.Header.Get("If-None-Match")
	if inm == "" {
		return false
	}
	for tag := range strings.SplitSeq(inm, ",") {
		tag = strings.TrimPrefix(strings.TrimSpace(tag), "W/") // weak comparison (RFC 9110 §13.1.2)
		if tag == "*" || tag == ETag(version) {
			w.WriteHeader(http.StatusNotModified)
			return true
		}
	}
	return false
}

func staleError(current int64) *Error {
	return newError(http.StatusPreconditionFailed, ErrPreconditionFailed, "current ETag is "+ETag(current), nil)
}

// VersionedConfig describes a table whose rows carry a version column.
type VersionedConfig struct {
	// Table is the table, optionally schema-qualified ("public.orders").
	// Required.
	Table string
	// KeyColumns identify one row; Update takes their values in this order.
	// Include the tenant column so one tenant cannot touch another's rows.
	// Defaults to ["id"].
	KeyColumns []string
	// VersionColumn is a bigint incremented by every Update. Defaults to
	// "version".
	VersionColumn string
	// Optional lets an Update without If-Match proceed unconditionally.
	// Defaults to false: If-Match is required (428 without it).
	Optional bool
}

// Versioned runs updates guarded by If-Match against a version column:
// optimistic concurrency for PUT and PATCH.
type Versioned struct {
	cfg        VersionedConfig
	table      string
	currentSQL string
}

// NewVersioned returns a Versioned for cfg.
func NewVersioned(cfg VersionedConfig) (*Versioned, error) {
	if cfg.Table == "" {
		return nil, &dedupe.ConfigError{Field: "Table", Reason: "is required"}
	}
	if len(cfg.KeyColumns) == 0 {
		cfg.KeyColumns = []string{"id"}
	}
	if cfg.VersionColumn == "" {
		cfg.VersionColumn = "version"
	}
	table := pgx.Identifier(strings.Split(cfg.Table, ".")).Sanitize()
	return &Versioned{cfg: cfg, table: table, currentSQL: versionedCurrentSQL(table, cfg.KeyColumns, cfg.VersionColumn)}, nil
}

// Update applies set (a SET list such as "cart_id = $1, total_cents = $2",
// numbering args from $1; never built from user input) to the row whose key
// columns equal key, only if r's If-Match names its current version, and
// increments the version in the same statement. It returns the new version
// (send it with SetETag), or an error for which StatusCode gives the
// answer: ErrPreconditionRequired (428), ErrPreconditionFailed (412, the
// detail names the current ETag), ErrNotFound (404).
func (v *Versioned) Update(ctx context.Context, q dedupe.Querier, r *http.Request, key []any, set string, args ...any) (int64, error) {
	if len(key) != len(v.cfg.KeyColumns) {
		return 0, fmt.Errorf("httpidem: Update got %d key values for %d key columns", len(key), len(v.cfg.KeyColumns))
	}
	m := ParseIfMatch(r.Header)
	if !m.Present && !v.cfg.Optional {
		return 0, newError(http.StatusPreconditionRequired, ErrPreconditionRequired, "", nil)
	}
	versions := m.Versions
	if versions == nil {
		versions = []int64{}
	}
	all := append(append(append([]any(nil), args...), key...), versions, m.Any || !m.Present)
	var next int64
	err := q.QueryRow(ctx, versionedUpdateSQL(v.table, v.cfg.KeyColumns, v.cfg.VersionColumn, set, len(args)), all...).Scan(&next)
	if err == nil {
		return next, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, err
	}
	var current int64
	err = q.QueryRow(ctx, v.currentSQL, key...).Scan(&current)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, newError(http.StatusNotFound, ErrNotFound, "", nil)
	}
	if err != nil {
		return 0, err
	}
	return 0, staleError(current)
}
