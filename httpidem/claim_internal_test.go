package httpidem

import "testing"

// TestPlainRead: only a single SELECT without a locking clause or a lock
// function is sent without the claim's lock timeout; anything else may wait
// on a row lock.
func TestPlainRead(t *testing.T) {
	for sql, want := range map[string]bool{
		"SELECT scope, key, state FROM \"dedupe_http_keys\" WHERE scope = $2 AND key = $3": true,
		"SELECT state, locked_until,\n    result_status FROM t WHERE scope = $2":           true,
		"  select x\nfrom t where k = $1":                                                  true,
		"SELECT * FROM t WHERE k = $1 FOR UPDATE":                                          false,
		"SELECT * FROM t WHERE k = $1\nFOR\tSHARE":                                         false,
		"SELECT * FROM t for no key update":                                                false,
		"SELECT pg_advisory_xact_lock(1)":                                                  false,
		"SELECT pg_try_advisory_lock(1)":                                                   false,
		"SELECT 1; UPDATE t SET x = 1":                                                     false,
		"INSERT INTO t (k) VALUES ($1) ON CONFLICT DO NOTHING":                             false,
		"WITH x AS (UPDATE t SET v = 1 RETURNING 1) SELECT 1":                              false,
		"": false,
	} {
		if got := plainRead(sql); got != want {
			t.Errorf("plainRead(%q) = %v, want %v", sql, got, want)
		}
	}
}
