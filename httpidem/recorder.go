package httpidem

import (
	"bytes"
	"context"
	"net/http"

	"github.com/exactlyonce/dedupe"
)

// recorder buffers the handler's response: nothing reaches the client before
// the handler's transaction and the stored response have committed, so a
// client never sees an answer that was then rolled back.
//
// Streaming (Flush) and Hijack are not supported on idempotent routes.
type recorder struct {
	ctx    context.Context // the handler's: a handler that returns after it ended is late
	header http.Header
	status int
	// failed is an error status (4xx, 5xx) the handler wrote after it had
	// written a success (below 400): it failed after it had started to
	// answer, and the recorded status is not its answer.
	failed   int
	body     bytes.Buffer
	limit    int
	keepAll  bool // OversizeStoreHead: buffer past limit for this client
	oversize bool
}

func newRecorder(ctx context.Context, limit int, keepAll bool) *recorder {
	return &recorder{ctx: ctx, header: http.Header{}, limit: limit, keepAll: keepAll}
}

// Header returns the buffered response's header map.
func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the status code of the buffered response.
func (r *recorder) WriteHeader(status int) {
	if status < 200 {
		return // informational responses are not recorded
	}
	if r.status == 0 {
		r.status = status
		return
	}
	if r.status < 400 && status >= 400 && r.failed == 0 {
		r.failed = status
	}
}

// finish is called when the handler returned. It reports whether the
// handler's context had ended by then (the client went away, or the lease
// ran out): whatever the handler answered, its work may have been cut
// short, and it is not stored.
func (r *recorder) finish() bool { return r.ctx.Err() != nil }

// Write appends to the buffered response body.
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if r.body.Len()+len(p) > r.limit {
		r.oversize = true
		if !r.keepAll {
			// The response will be refused; stop buffering but let the
			// handler finish as if it was written.
			return len(p), nil
		}
	}
	return r.body.Write(p)
}

func (r *recorder) statusCode() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// result is what is stored with the key: the status, the selected headers
// and the body (or no body when it was too large). It shares the recorder's
// header values and body, which nothing changes once the handler returned:
// the result is encoded when it is stored and not kept.
func (r *recorder) result(stored []string) dedupe.Result {
	res := dedupe.Result{Status: r.statusCode(), Headers: make(map[string][]string, len(stored))}
	for _, name := range stored {
		if v := r.header.Values(name); len(v) > 0 {
			res.Headers[name] = v
		}
	}
	if r.oversize {
		res.Headers[BodyOmittedHeader] = []string{"true"}
	} else {
		res.Body = r.body.Bytes()
	}
	return res
}

// writeTo sends the buffered response to the client with all its headers.
func (r *recorder) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.header {
		h[k] = v
	}
	w.WriteHeader(r.statusCode())
	_, _ = w.Write(r.body.Bytes())
}
