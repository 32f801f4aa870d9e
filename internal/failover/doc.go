// Package failover runs PostgreSQL failovers under the library: a primary
// and a streaming standby of its own (Cluster, run from PostgreSQL 15's
// binaries as the postgres OS user, on free loopback ports, never the shared
// server), the primary killed mid-load and the standby promoted while
// consumers carry on through a multi-host connection string
// (target_session_attrs=read-write).
//
// Its tests (TestFailover...) count what a failover does to acknowledged
// messages: with synchronous replication none is lost and none doubled
// (TestFailoverSync); with asynchronous replication TestFailoverAsync
// measures how many acknowledged messages lost their effect. Around them: a
// COMMIT reply lost in the failover is resolved on the new primary, leases
// and fencing tokens hold there, the outbox relay keeps each key's order,
// and ConsumerConfig.SynchronousCommit makes a claim wait for its standby.
//
// The default test run has one short run of each but TestFailoverAsync,
// which is built with the failover tag: .ci/failover runs it and more runs
// of TestFailoverSync (-failover.runs, -failover.messages,
// -failover.failovers).
package failover
