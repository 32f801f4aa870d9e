// Package dedupetest is a kit for proving that your own handlers have
// exactly-once effects under the failures that break naive consumers:
// duplicates delivered at the same instant, a transaction failing at COMMIT,
// a COMMIT whose reply is lost, a lease that runs out while the handler
// runs, a poisoned key.
//
// A test gets a throwaway schema on a real PostgreSQL server (DATABASE_URL,
// else 127.0.0.1:5432 with database test, else a container started with
// testcontainers where a Docker engine runs) with the inbox migrated:
//
//	env := dedupetest.New(t, dedupetest.Options{})
//	consumer, _ := dedupe.NewConsumer(env.Inbox, cfg, chargeHandler)
//	got := dedupetest.Deliver(t, consumer, msg, 20) // 20 copies at once
//	got.ExactlyOnce(t)                             // one claimed, the rest duplicates
//	env.WantCount(t, 1, "SELECT count(*) FROM charges WHERE order_id = $1", msg.ID)
//
// The faults are real, not mocks: Faulty puts a PostgreSQL-protocol proxy
// between a pool and the server that drops the reply to the next COMMIT
// (after the server committed) or cuts the connection before it;
// FailNextCommit makes the next transaction that writes the inbox fail at
// COMMIT through a deferred constraint trigger; ExpireLeases ends every live
// lease at once; Poison marks a key failed. Clock is a controllable clock for
// dedupe.Config.Clock, which stands in for the database's clock in lease and
// expiry decisions.
//
// The assertions check what the inbox stored, in the style of rivertest's:
// RequireKey (state, attempts, stored result, last error at once),
// RequireState, RequireAttempts, RequireResult and RequireAbsent.
//
// The kit fails, never hangs: every call is bounded by the test's deadline
// (less a margin, so that the kit's message comes before go test's panic)
// or DefaultTimeout, whichever comes first. A delivery that does not end in
// time fails the test with its likely cause, most often a handler that
// writes through a second connection (env.Pool) instead of its transaction
// while more copies run at once than the pool has connections. The kit's
// own tests show it failing the mistakes it exists to catch: a handler
// writing outside its transaction, a key that differs per delivery (unsafe
// under concurrent duplicates), and a handler that commits or rolls back the
// transaction it was given.
//
// It is its own module so that testcontainers stays out of the dependencies
// of programs that import only the library.
package dedupetest
