// Package drivertest runs the core's contract against every driver: pgx,
// database/sql over pgx's stdlib, and database/sql over lib/pq. It is its
// own module so that lib/pq stays out of the library's dependencies.
package drivertest
