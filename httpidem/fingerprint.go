package httpidem

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"net/http"
	"slices"
)

// DefaultFingerprint hashes the request method, path, raw query and body
// with SHA-256. Headers are not part of it, so a retry that changes a
// tracing or date header is still the same request.
func DefaultFingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	writeRequest(h, r, body)
	return h.Sum(nil)
}

// FingerprintWithHeaders returns a fingerprint of DefaultFingerprint's parts
// plus the values of the named request headers (for example Content-Type or
// an API version header), so that the same key with another value of one of
// them answers 422. Other headers are ignored.
func FingerprintWithHeaders(names ...string) func(r *http.Request, body []byte) []byte {
	canon := make([]string, len(names))
	for i, n := range names {
		canon[i] = http.CanonicalHeaderKey(n)
	}
	slices.Sort(canon)
	return func(r *http.Request, body []byte) []byte {
		h := sha256.New()
		writeRequest(h, r, body)
		for _, n := range canon {
			vals := r.Header.Values(n)
			parts := append([]string{n}, vals...)
			writeParts(h, parts...)
		}
		return h.Sum(nil)
	}
}

// writeRequest writes DefaultFingerprint's parts: method, path, raw query
// and body. The body is hashed in place, not copied into a string.
func writeRequest(h hash.Hash, r *http.Request, body []byte) {
	writeParts(h, r.Method, r.URL.EscapedPath(), r.URL.RawQuery)
	writePart(h, body)
}

// writeParts length-prefixes each part so that ("a","bc") and ("ab","c")
// hash differently.
func writeParts(h hash.Hash, parts ...string) {
	for _, p := range parts {
		writePart(h, []byte(p))
	}
}

func writePart(h hash.Hash, p []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(p)))
	h.Write(n[:])
	h.Write(p)
}
