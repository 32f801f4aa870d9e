package direct

import (
	"encoding/binary"
	"errors"
	"math"
	"time"
)

// PostgreSQL's binary format for the few types the direct claim round
// sends and reads, so that a claim encodes and decodes
// without pgx's type map and its per-value allocations. Every other
// statement goes through pgx.

// Type OIDs of the values the direct round sends and reads.
const (
	OIDBytea       = 17
	OIDInt8        = 20
	OIDInt4        = 23
	OIDText        = 25
	OIDTimestamptz = 1184
	OIDInterval    = 1186
)

// BinaryFormat is the format code of every parameter and result column
// of the direct round: one code applies to all.
var BinaryFormat = []int16{1}

// y2kMicros is 2000-01-01 00:00 UTC, PostgreSQL's epoch, in microseconds
// since the Unix epoch.
const y2kMicros = 946684800 * 1000000

// AppendTimestamptz appends t as a binary timestamptz.
func AppendTimestamptz(buf []byte, t time.Time) []byte {
	us := t.Unix()*1000000 + int64(t.Nanosecond())/1000 - y2kMicros
	return binary.BigEndian.AppendUint64(buf, uint64(us))
}

// AppendInterval appends d as a binary interval (microseconds, no days or
// months, as pgx sends a time.Duration).
func AppendInterval(buf []byte, d time.Duration) []byte {
	buf = binary.BigEndian.AppendUint64(buf, uint64(d.Microseconds()))
	return binary.BigEndian.AppendUint64(buf, 0) // days, months
}

// AppendInt8 appends v as a binary bigint.
func AppendInt8(buf []byte, v int64) []byte { return binary.BigEndian.AppendUint64(buf, uint64(v)) }

// ErrWireValue is a value of unexpected length in a result row.
var ErrWireValue = errors.New("dedupe: malformed value in a result row")

// WireInt4 decodes a binary integer.
func WireInt4(v []byte) (int, error) {
	if len(v) != 4 {
		return 0, ErrWireValue
	}
	return int(int32(binary.BigEndian.Uint32(v))), nil
}

// WireInt8 decodes a binary bigint.
func WireInt8(v []byte) (int64, error) {
	if len(v) != 8 {
		return 0, ErrWireValue
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// WireTimestamptz decodes a binary timestamptz as pgx does (time.Unix, in
// the local zone). Infinity has no time.Time and is refused.
func WireTimestamptz(v []byte) (time.Time, error) {
	us, err := WireInt8(v)
	if err != nil {
		return time.Time{}, err
	}
	if us == math.MaxInt64 || us == math.MinInt64 {
		return time.Time{}, errors.New("dedupe: infinite timestamp in a result row")
	}
	// Split as pgx splits it, so that no sum overflows.
	return time.Unix(y2kMicros/1000000+us/1000000, (us%1000000)*1000), nil
}

// WireInterval decodes a binary interval as pgx scans one into a
// time.Duration: a day is 24 hours, a month 30 days.
func WireInterval(v []byte) (time.Duration, error) {
	if len(v) != 16 {
		return 0, ErrWireValue
	}
	us := int64(binary.BigEndian.Uint64(v[:8]))
	days := int64(int32(binary.BigEndian.Uint32(v[8:12])))
	months := int64(int32(binary.BigEndian.Uint32(v[12:])))
	return time.Duration(us+(days+months*30)*24*60*60*1000000) * time.Microsecond, nil
}

// WireState decodes a key's state without allocating for the three states
// the table allows.
func WireState(v []byte) string {
	switch string(v) {
	case "complete":
		return "complete"
	case "in_flight":
		return "in_flight"
	case "failed":
		return "failed"
	}
	return string(v)
}
