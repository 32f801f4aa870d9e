// Package errtext keeps the root package's error texts to one "dedupe: "
// each: an error that wraps another of the package's prints the inner one
// without its prefix, so that a chain reads "dedupe: a: b: c".
package errtext

import "strings"

// Prefix begins every error text of the root package.
const Prefix = "dedupe: "

// Text is err's text without Prefix.
func Text(err error) string {
	if err == nil {
		return "<nil>"
	}
	return strings.TrimPrefix(err.Error(), Prefix)
}

// bareErr is an error printed without Prefix, for a message that wraps it
// after its own (fmt.Errorf("dedupe: …: %w", Bare(err))).
type bareErr struct{ err error }

func (b bareErr) Error() string { return Text(b.err) }
func (b bareErr) Unwrap() error { return b.err }

// Bare returns err printed without Prefix; nil for nil.
func Bare(err error) error {
	if err == nil {
		return nil
	}
	return bareErr{err}
}

// wrapped is outer followed by inner, both matched by errors.Is/As.
type wrapped struct{ outer, inner error }

func (w *wrapped) Error() string   { return w.outer.Error() + ": " + Text(w.inner) }
func (w *wrapped) Unwrap() []error { return []error{w.outer, w.inner} }

// Wrap returns outer: inner, inner printed without Prefix.
func Wrap(outer, inner error) error { return &wrapped{outer: outer, inner: inner} }
