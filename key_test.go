package dedupe_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/exactlyonce/dedupe"
)

func TestKeyValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		key    dedupe.Key
		reason error
	}{
		{"valid", dedupe.Key{Scope: "s", ID: "order-1"}, nil},
		{"255 bytes", dedupe.Key{Scope: "s", ID: strings.Repeat("a", 255)}, nil},
		{"unicode", dedupe.Key{Scope: "tenant-ü", ID: "clé"}, nil},
		{"256 bytes", dedupe.Key{Scope: "s", ID: strings.Repeat("a", 256)}, dedupe.ErrKeyTooLong},
		{"empty", dedupe.Key{Scope: "s", ID: ""}, dedupe.ErrKeyEmpty},
		{"NUL", dedupe.Key{Scope: "s", ID: "a\x00b"}, dedupe.ErrKeyInvalidChar},
		{"newline", dedupe.Key{Scope: "s", ID: "a\nb"}, dedupe.ErrKeyInvalidChar},
		{"DEL", dedupe.Key{Scope: "s", ID: "a\x7fb"}, dedupe.ErrKeyInvalidChar},
		{"bad utf8", dedupe.Key{Scope: "s", ID: "a\xffb"}, dedupe.ErrKeyInvalidChar},
		{"empty scope", dedupe.Key{Scope: "", ID: "k"}, dedupe.ErrKeyEmpty},
	}
	for _, tc := range cases {
		err := tc.key.Validate()
		if tc.reason == nil {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var ke *dedupe.KeyError
		if !errors.Is(err, dedupe.ErrInvalidKey) || !errors.Is(err, tc.reason) || !errors.As(err, &ke) {
			t.Errorf("%s: %v, want ErrInvalidKey and %v", tc.name, err, tc.reason)
		}
	}
}

func TestDeriveKeyStableAndDistinct(t *testing.T) {
	t.Parallel()
	k := dedupe.Key{Scope: "orders", ID: "o-1"}
	a := dedupe.DeriveKey(k, "charge")
	if a != dedupe.DeriveKey(k, "charge") {
		t.Fatal("derived key not stable")
	}
	uuid5 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	if !uuid5.MatchString(a) {
		t.Fatalf("derived key %q is not a version 5 UUID", a)
	}
	others := []string{
		dedupe.DeriveKey(k, "email"),
		dedupe.DeriveKey(dedupe.Key{Scope: "orders", ID: "o-2"}, "charge"),
		dedupe.DeriveKey(dedupe.Key{Scope: "refunds", ID: "o-1"}, "charge"),
		dedupe.DeriveKey(dedupe.Key{Scope: "orders", ID: "o-1c"}, "harge"),
	}
	for _, o := range others {
		if o == a {
			t.Fatalf("derived keys collide: %s", o)
		}
	}
}

func FuzzKeyValidate(f *testing.F) {
	for _, s := range []string{"", "a", "a\x00", strings.Repeat("x", 300), "\xff", "ok-key_1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := dedupe.Key{Scope: "s", ID: s}.Validate()
		if err == nil && (s == "" || len(s) > dedupe.MaxKeyLen || strings.ContainsAny(s, "\x00\n\r\t")) {
			t.Fatalf("accepted %q", s)
		}
		_ = dedupe.DeriveKey(dedupe.Key{Scope: "s", ID: s}, s)
	})
}
