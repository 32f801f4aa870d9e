package dedupe_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/exactlyonce/dedupe"
)

// TestErrorTextsSayDedupeOnce: an error of the package that wraps another
// of the package's says "dedupe: " once, at its start ("dedupe: invalid key
// \"\": key is empty", never "…: dedupe: key is empty"), and still matches
// both with errors.Is. The main paths' errors are checked by the driver
// suite's outcome table (internal/drivertest).
func TestErrorTextsSayDedupeOnce(t *testing.T) {
	_, cfgErr := dedupe.New(nil, dedupe.Config{})
	keyErr := dedupe.Key{Scope: "s", ID: ""}.Validate()
	inner := dedupe.ErrTxEnded
	for _, tc := range []struct {
		name string
		err  error
		is   []error
	}{
		{"KeyError", keyErr, []error{dedupe.ErrInvalidKey, dedupe.ErrKeyEmpty}},
		{"ConfigError", cfgErr, []error{dedupe.ErrInvalidConfig}},
		{"HandlerError", &dedupe.HandlerError{Key: dedupe.Key{Scope: "s", ID: "k"}, Attempt: 1, Err: inner}, []error{inner}},
		{"HandlerErrorOfPermanent", &dedupe.HandlerError{Attempt: 1, Err: dedupe.Permanent(dedupe.ErrConflict)}, []error{dedupe.ErrConflict}},
		{"PanicError", &dedupe.HandlerError{Err: &dedupe.PanicError{Value: dedupe.ErrNotFound}}, []error{dedupe.ErrNotFound}},
		{"PermanentError", dedupe.Permanent(dedupe.ErrPoisoned), []error{dedupe.ErrPoisoned}},
		{"OutcomeUnknownError", &dedupe.OutcomeUnknownError{Op: "commit", Err: dedupe.ErrLeaseLost}, []error{dedupe.ErrOutcomeUnknown, dedupe.ErrLeaseLost}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil {
				t.Fatal("no error")
			}
			text := tc.err.Error()
			if !strings.HasPrefix(text, "dedupe: ") || strings.Count(text, "dedupe:") != 1 {
				t.Fatalf("%q: want one \"dedupe: \" prefix", text)
			}
			for _, target := range tc.is {
				if !errors.Is(tc.err, target) {
					t.Fatalf("%v does not match %v", tc.err, target)
				}
			}
		})
	}
}
