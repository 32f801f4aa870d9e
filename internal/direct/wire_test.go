package direct

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// FuzzWireDecode: the direct round's decoders read what pgx reads from the
// same bytes, and refuse what pgx refuses.
func FuzzWireDecode(f *testing.F) {
	f.Add(binary.BigEndian.AppendUint64(nil, 0))
	f.Add(binary.BigEndian.AppendUint64(nil, uint64(847_000_123_456)))
	f.Add(binary.BigEndian.AppendUint64(nil, ^uint64(999_999))) // before 2000, a fraction of a second
	f.Add(append(binary.BigEndian.AppendUint64(nil, 5_000_000), 0, 0, 0, 1, 0, 0, 0, 2))
	f.Add(append(binary.BigEndian.AppendUint64(nil, ^uint64(0)), 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0))
	f.Add([]byte{0, 0, 0, 7})
	f.Add([]byte{0x80, 0, 0, 0})
	f.Add([]byte("in_flight"))
	m := pgtype.NewMap()
	f.Fuzz(func(t *testing.T, b []byte) {
		var wantTime time.Time
		gotTime, err := WireTimestamptz(b)
		werr := m.Scan(OIDTimestamptz, 1, b, &wantTime)
		switch {
		case err == nil && werr == nil:
			if !gotTime.Equal(wantTime) {
				t.Fatalf("timestamptz %x = %v, pgx %v", b, gotTime, wantTime)
			}
		case werr == nil:
			t.Fatalf("timestamptz %x: err %v, pgx reads %v", b, err, wantTime)
		case err == nil && len(b) != 8:
			// pgx also refuses a time outside PostgreSQL's range, which
			// the server never sends; a wrong length must be refused.
			t.Fatalf("timestamptz %x read as %v, pgx err %v", b, gotTime, werr)
		}
		var wantDur time.Duration
		gotDur, err := WireInterval(b)
		if werr := m.Scan(OIDInterval, 1, b, &wantDur); (err == nil) != (werr == nil) {
			t.Fatalf("interval %x: err %v, pgx err %v", b, err, werr)
		} else if err == nil && gotDur != wantDur {
			t.Fatalf("interval %x = %v, pgx %v", b, gotDur, wantDur)
		}
		var want4 int
		got4, err := WireInt4(b)
		if werr := m.Scan(OIDInt4, 1, b, &want4); (err == nil) != (werr == nil) {
			t.Fatalf("int4 %x: err %v, pgx err %v", b, err, werr)
		} else if err == nil && got4 != want4 {
			t.Fatalf("int4 %x = %d, pgx %d", b, got4, want4)
		}
		var want8 int64
		got8, err := WireInt8(b)
		if werr := m.Scan(OIDInt8, 1, b, &want8); (err == nil) != (werr == nil) {
			t.Fatalf("int8 %x: err %v, pgx err %v", b, err, werr)
		} else if err == nil && got8 != want8 {
			t.Fatalf("int8 %x = %d, pgx %d", b, got8, want8)
		}
		if got := WireState(b); got != string(b) {
			t.Fatalf("state %q = %q", b, got)
		}
	})
}

// TestWireEncode: the direct round's encoders write what pgx writes for
// the same values.
func TestWireEncode(t *testing.T) {
	m := pgtype.NewMap()
	for _, tm := range []time.Time{
		time.Date(2026, 12, 5, 1, 2, 3, 456789000, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", -3600)),
		time.Date(1970, 1, 1, 0, 0, 0, 1, time.UTC),
		time.Date(2300, 6, 1, 0, 0, 0, 0, time.Local),
	} {
		want, err := m.Encode(OIDTimestamptz, 1, tm, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendTimestamptz(nil, tm); string(got) != string(want) {
			t.Errorf("timestamptz %v: %x, pgx %x", tm, got, want)
		}
		back, err := WireTimestamptz(want)
		if err != nil || !back.Equal(tm.Truncate(time.Microsecond)) {
			t.Errorf("timestamptz %v read back as %v, %v", tm, back, err)
		}
	}
	for _, d := range []time.Duration{0, time.Second, 7 * 24 * time.Hour, -90 * time.Minute, 1500 * time.Nanosecond, -1500 * time.Nanosecond} {
		want, err := m.Encode(OIDInterval, 1, d, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendInterval(nil, d); string(got) != string(want) {
			t.Errorf("interval %v: %x, pgx %x", d, got, want)
		}
	}
	for _, v := range []int64{0, 1, -1, 1 << 62, -(1 << 63)} {
		want, err := m.Encode(OIDInt8, 1, v, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendInt8(nil, v); string(got) != string(want) {
			t.Errorf("int8 %d: %x, pgx %x", v, got, want)
		}
	}
}
