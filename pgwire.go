package dedupe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// PostgreSQL's binary format for the few types the direct claim round
// (pgxdirect.go) sends and reads, so that a claim encodes and decodes
// without pgx's type map and its per-value allocations. Every other
// statement goes through pgx.

// Type OIDs of the values the direct round sends and reads.
const (
	oidBytea       = 17
	oidInt8        = 20
	oidInt4        = 23
	oidText        = 25
	oidTimestamptz = 1184
	oidInterval    = 1186
)

// binaryFormat is the format code of every parameter and result column
// of the direct round: one code applies to all.
var binaryFormat = []int16{1}

// y2kMicros is 2000-01-01 00:00 UTC, PostgreSQL's epoch, in microseconds
// since the Unix epoch.
const y2kMicros = 946684800 * 1000000

// appendTimestamptz appends t as a binary timestamptz.
func appendTimestamptz(buf []byte, t time.Time) []byte {
	us := t.Unix()*1000000 + int64(t.Nanosecond())/1000 - y2kMicros
	return binary.BigEndian.AppendUint64(buf, uint64(us))
}

// appendInterval appends d as a binary interval (microseconds, no days or
// months, as pgx sends a time.Duration).
func appendInterval(buf []byte, d time.Duration) []byte {
	buf = binary.BigEndian.AppendUint64(buf, uint64(d.Microseconds()))
	return binary.BigEndian.AppendUint64(buf, 0) // days, months
}

// appendInt8 appends v as a binary bigint.
func appendInt8(buf []byte, v int64) []byte { return binary.BigEndian.AppendUint64(buf, uint64(v)) }

// errWireValue is a value of unexpected length in a result row.
var errWireValue = errors.New("dedupe: malformed value in a result row")

// wireInt4 decodes a binary integer.
func wireInt4(v []byte) (int, error) {
	if len(v) != 4 {
		return 0, errWireValue
	}
	return int(int32(binary.BigEndian.Uint32(v))), nil
}

// wireInt8 decodes a binary bigint.
func wireInt8(v []byte) (int64, error) {
	if len(v) != 8 {
		return 0, errWireValue
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// wireTimestamptz decodes a binary timestamptz as pgx does (time.Unix, in
// the local zone). Infinity has no time.Time and is refused.
func wireTimestamptz(v []byte) (time.Time, error) {
	us, err := wireInt8(v)
	if err != nil {
		return time.Time{}, err
	}
	if us == math.MaxInt64 || us == math.MinInt64 {
		return time.Time{}, fmt.Errorf("dedupe: infinite timestamp in a result row")
	}
	// Split as pgx splits it, so that no sum overflows.
	return time.Unix(y2kMicros/1000000+us/1000000, (us%1000000)*1000), nil
}

// wireInterval decodes a binary interval as pgx scans one into a
// time.Duration: a day is 24 hours, a month 30 days.
func wireInterval(v []byte) (time.Duration, error) {
	if len(v) != 16 {
		return 0, errWireValue
	}
	us := int64(binary.BigEndian.Uint64(v[:8]))
	days := int64(int32(binary.BigEndian.Uint32(v[8:12])))
	months := int64(int32(binary.BigEndian.Uint32(v[12:])))
	return time.Duration(us+(days+months*30)*24*60*60*1000000) * time.Microsecond, nil
}

// wireState decodes a key's state without allocating for the three states
// the table allows.
func wireState(v []byte) string {
	switch string(v) {
	case string(StateComplete):
		return string(StateComplete)
	case string(StateInFlight):
		return string(StateInFlight)
	case string(StateFailed):
		return string(StateFailed)
	}
	return string(v)
}
