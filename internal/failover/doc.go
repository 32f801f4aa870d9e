// Package failover runs PostgreSQL failovers under the library: a primary
// and a streaming standby of its own (Cluster, run from PostgreSQL 15's
// binaries as the postgres OS user, on free loopback ports, never the shared
// server), the primary killed mid-load and the standby promoted while
// consumers carry on through a multi-host connection string
// (target_session_attrs=read-write).
//
// Its tests (TestFailover...) count what a failover does to acknowledged
// messages: with synchronous replication none is lost and none doubled;
// with asynchronous replication they measure how many acknowledged messages
// lost their effect. The short runs are in the default test run; more runs
// with -failover.runs (.ci/failover).
package failover
