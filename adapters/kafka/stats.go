package dedupekafka

import "sync/atomic"

// Stats counts what a Runner did since it was built.
type Stats struct {
	Fetched          int64 // messages returned by the partition readers
	Handled          int64 // messages whose handler ran and whose effects committed
	Duplicates       int64 // messages skipped because their key was complete
	Retries          int64 // attempts that failed and were retried
	GivenUp          int64 // messages poisoned, conflicting or unkeyable, then committed
	DeadLettered     int64 // given-up messages written to the dead-letter topic
	DeadLetterErrors int64 // failed dead-letter writes (each retried, up to Config.DeadLetterAttempts)
	Paused           int64 // partitions paused now because a dead-letter write kept failing
	Batches          int64 // batch transactions committed
	Fallbacks        int64 // batches handled one message per transaction instead
	Commits          int64 // successful offset commits (each covers every partition that moved)
	CommitErrors     int64 // failed offset commits (retried at the next interval; a crash redelivers)
}

type stats struct {
	fetched, handled, duplicates, retries, givenUp, deadLettered, deadLetterErrors, paused,
	batches, fallbacks, commits, commitErrors atomic.Int64
}

// Stats returns a snapshot of the runner's counters.
func (r *Runner) Stats() Stats {
	s := &r.stats
	return Stats{
		Fetched: s.fetched.Load(), Handled: s.handled.Load(), Duplicates: s.duplicates.Load(),
		Retries: s.retries.Load(), GivenUp: s.givenUp.Load(), DeadLettered: s.deadLettered.Load(),
		DeadLetterErrors: s.deadLetterErrors.Load(), Paused: s.paused.Load(),
		Batches: s.batches.Load(), Fallbacks: s.fallbacks.Load(), Commits: s.commits.Load(),
		CommitErrors: s.commitErrors.Load(),
	}
}
