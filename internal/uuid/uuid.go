// Package uuid formats RFC 9562 UUIDs for the keys and message ids dedupe
// generates, without a dependency.
package uuid

import (
	"crypto/rand"
	"encoding/hex"
)

// New returns a random (version 4) UUID.
func New() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return Format(b, 4)
}

// Format sets the version and the RFC 9562 variant bits of b and returns
// it in the canonical 8-4-4-4-12 form.
func Format(b [16]byte, version byte) string {
	b[6] = b[6]&0x0f | version<<4
	b[8] = b[8]&0x3f | 0x80
	var buf [36]byte
	hex.Encode(buf[0:8], b[0:4])
	buf[8] = '-'
	hex.Encode(buf[9:13], b[4:6])
	buf[13] = '-'
	hex.Encode(buf[14:18], b[6:8])
	buf[18] = '-'
	hex.Encode(buf[19:23], b[8:10])
	buf[23] = '-'
	hex.Encode(buf[24:36], b[10:16])
	return string(buf[:])
}
