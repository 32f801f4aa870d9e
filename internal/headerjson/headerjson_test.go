package headerjson

import (
	"bytes"
	"encoding/json"
	"testing"
)

// Encode writes what json.Marshal writes, byte for byte, for headers
// with every kind of character encoding/json escapes.
func TestHeadersJSONMatchesEncodingJSON(t *testing.T) {
	cases := []map[string][]string{
		{},
		{"Content-Type": {"application/json"}, "Location": {"/orders/1"}, "Link": {"<a>; rel=next", "<b>; rel=prev"}},
		{"X-Empty": {}, "X-Nil": nil, "X-Blank": {""}},
		{"X-Esc": {"quote \" backslash \\ tab \t nl \n cr \r bs \b ff \f nul \x00 us \x1f del \x7f"}},
		{"X-Html": {"<script>&amp;</script>"}, "X-Seps": {"a\u2028b\u2029c"}},
		{"X-Utf8": {"héllo wörld ✓ 𝄞"}, "X-Bad": {"bad \xff\xfe utf8 \xe2\x82 end", "\xc0"}},
		{"Zed": {"z"}, "alpha": {"a"}, "Beta": {"b"}, "\u00e9": {"e"}},
	}
	for _, h := range cases {
		want, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Encode(h)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("Encode(%q)\n got %s\nwant %s", h, got, want)
		}
	}
	if got, _ := Encode(nil); got != nil {
		t.Errorf("Encode(nil) = %q, want nil (NULL)", got)
	}
}

func FuzzHeadersJSON(f *testing.F) {
	f.Add("Content-Type", "text/plain; charset=utf-8", "b")
	f.Fuzz(func(t *testing.T, k, v1, v2 string) {
		h := map[string][]string{k: {v1, v2}, "K" + k: {v2}}
		want, _ := json.Marshal(h)
		got, _ := Encode(h)
		if !bytes.Equal(got, want) {
			t.Errorf("got %s, want %s", got, want)
		}
	})
}
