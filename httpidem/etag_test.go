package httpidem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func versionedSetup(t *testing.T) (*dbtest.DB, *httpidem.Versioned) {
	t.Helper()
	db := dbtest.New(t, dbtest.Options{MaxConns: 8})
	db.Exec(t, `CREATE TABLE items (tenant_id text NOT NULL, id bigint NOT NULL, name text NOT NULL,
		version bigint NOT NULL DEFAULT 1, PRIMARY KEY (tenant_id, id))`)
	db.Exec(t, `INSERT INTO items (tenant_id, id, name) VALUES ('acme', 1, 'one'), ('globex', 1, 'theirs')`)
	v, err := httpidem.NewVersioned(httpidem.VersionedConfig{Table: "items", KeyColumns: []string{"tenant_id", "id"}})
	if err != nil {
		t.Fatal(err)
	}
	return db, v
}

func putRequest(ifMatch ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPut, "/items/1", nil)
	for _, m := range ifMatch {
		r.Header.Add("If-Match", m)
	}
	return r
}

func TestVersionedUpdatePreconditions(t *testing.T) {
	t.Parallel()
	db, v := versionedSetup(t)
	ctx := context.Background()
	update := func(r *http.Request, tenant, name string) (int64, error) {
		return v.Update(ctx, db.Pool, r, []any{tenant, 1}, "name = $1", name)
	}
	if _, err := update(putRequest(), "acme", "x"); !errors.Is(err, httpidem.ErrPreconditionRequired) || httpidem.StatusCode(err) != 428 {
		t.Fatalf("no If-Match: %v (status %d), want 428", err, httpidem.StatusCode(err))
	}
	next, err := update(putRequest(httpidem.ETag(1)), "acme", "two")
	if err != nil || next != 2 {
		t.Fatalf("matching If-Match: %d, %v; want version 2", next, err)
	}
	_, err = update(putRequest(httpidem.ETag(1)), "acme", "stale")
	if !errors.Is(err, httpidem.ErrPreconditionFailed) || httpidem.StatusCode(err) != 412 {
		t.Fatalf("stale If-Match: %v, want 412", err)
	}
	w := httptest.NewRecorder()
	httpidem.WriteError(w, nil, err)
	if w.Code != 412 || !strings.Contains(w.Body.String(), `\"2\"`) {
		t.Fatalf("412 body %q should name the current ETag", w.Body)
	}
	if _, err := update(putRequest(`W/"2"`), "acme", "weak"); !errors.Is(err, httpidem.ErrPreconditionFailed) {
		t.Fatalf("weak tag: %v, want 412 (If-Match compares strongly)", err)
	}
	if next, err := update(putRequest(`"9", "2"`), "acme", "three"); err != nil || next != 3 {
		t.Fatalf("list with the current tag: %d, %v; want 3", next, err)
	}
	if next, err := update(putRequest("*"), "acme", "four"); err != nil || next != 4 {
		t.Fatalf("If-Match *: %d, %v; want 4", next, err)
	}
	if _, err := v.Update(ctx, db.Pool, putRequest("*"), []any{"acme", 99}, "name = $1", "x"); !errors.Is(err, httpidem.ErrNotFound) || httpidem.StatusCode(err) != 404 {
		t.Fatalf("missing row: %v, want 404", err)
	}
	// The other tenant's row with the same id is untouched.
	if n := db.Count(t, "SELECT version FROM items WHERE tenant_id = 'globex'"); n != 1 {
		t.Fatalf("globex version = %d, want 1", n)
	}
	if n := db.Count(t, "SELECT count(*) FROM items WHERE tenant_id = 'acme' AND name = 'four' AND version = 4"); n != 1 {
		t.Fatal("the row does not hold the last accepted update")
	}
}

func TestVersionedConcurrentUpdatesOneWins(t *testing.T) {
	t.Parallel()
	db, v := versionedSetup(t)
	const n = 8
	errs := make([]error, n)
	together(n, func(i int) {
		_, errs[i] = v.Update(context.Background(), db.Pool, putRequest(httpidem.ETag(1)), []any{"acme", 1}, "name = $1", "writer")
	})
	var won, stale int
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.Is(err, httpidem.ErrPreconditionFailed):
			stale++
		default:
			t.Fatalf("unexpected error %v", err)
		}
	}
	if won != 1 || stale != n-1 {
		t.Fatalf("won %d, stale %d; want exactly one winner", won, stale)
	}
	if got := db.Count(t, "SELECT version FROM items WHERE tenant_id = 'acme' AND id = 1"); got != 2 {
		t.Fatalf("version = %d, want 2", got)
	}
}

func TestIfMatchHelpers(t *testing.T) {
	t.Parallel()
	if err := httpidem.CheckIfMatch(putRequest(), 3, false); err != nil {
		t.Errorf("optional and absent: %v", err)
	}
	if err := httpidem.CheckIfMatch(putRequest(), 3, true); httpidem.StatusCode(err) != 428 {
		t.Errorf("required and absent: %v", err)
	}
	if err := httpidem.CheckIfMatch(putRequest(`"2"`), 3, false); httpidem.StatusCode(err) != 412 {
		t.Errorf("stale: %v", err)
	}
	if err := httpidem.CheckIfMatch(putRequest(`"3"`), 3, true); err != nil {
		t.Errorf("current: %v", err)
	}
	r := httptest.NewRequest(http.MethodGet, "/items/1", nil)
	r.Header.Set("If-None-Match", `W/"3"`)
	w := httptest.NewRecorder()
	if !httpidem.NotModified(w, r, 3) || w.Code != 304 || w.Header().Get("ETag") != `"3"` {
		t.Errorf("If-None-Match current: %d %v", w.Code, w.Header())
	}
	w = httptest.NewRecorder()
	if httpidem.NotModified(w, r, 4) || w.Header().Get("ETag") != `"4"` {
		t.Errorf("If-None-Match stale reported not modified")
	}
	if _, err := httpidem.NewVersioned(httpidem.VersionedConfig{}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Errorf("NewVersioned without table: %v", err)
	}
}
