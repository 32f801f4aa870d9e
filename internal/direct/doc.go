// Package direct is the pgx driver's direct claim round: on a pgx pool or
// connection in pgx's default statement mode and without a tracer (and over
// database/sql through the *pgx.Conn under pgx's stdlib), a Consumer's BEGIN,
// settings, claim, peek and savepoint go as one pgconn batch of statements
// prepared once per connection, their values encoded and decoded here in
// PostgreSQL's binary format (wire.go), without pgx's per-value type plans.
// The root package decides when the round is sent and turns its Result into
// a claim; this package knows statements, connections and bytes, nothing of
// inboxes, keys or outcomes.
package direct
