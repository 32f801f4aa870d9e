package main

import (
	"errors"

	"github.com/exactlyonce/dedupe"
)

// Exit codes of every subcommand. doc.go and the help text list them; keep
// the three in step.
const (
	exitOK          = 0   // done (for run: the command succeeded, or the key was already complete)
	exitError       = 1   // the database or the operation failed
	exitUsage       = 2   // bad flags or arguments, an invalid key, a database URL that does not parse
	exitNotFound    = 3   // inspect, release: no such key; outbox unpark, discard: no such parked message
	exitNotMigrated = 4   // the inbox table does not exist: run "dedupe migrate up"
	exitInFlight    = 75  // the key is held by a live lease elsewhere; retry later (EX_TEMPFAIL)
	exitPoisoned    = 76  // run: the key is marked failed; "dedupe release" it to allow another run
	exitConflict    = 77  // run: the key was used with a different command
	exitRunFailed   = 125 // run: dedupe itself failed around the command (database, lost lease)
	exitCannotExec  = 126 // run: the command exists but could not be started
	exitNotExist    = 127 // run: the command was not found
)

// exitCodes is the table printed by "dedupe help" and mirrored in doc.go.
const exitCodes = `Exit codes:
  0    success; for run: the command exited 0, or the key was already complete
       (a key completed with --on-failure=complete replays its stored status)
  1    error: the database or the operation failed
  2    usage: bad flags or arguments, invalid key, a database URL that does
       not parse (with none, dedupe uses the local default: see --database-url)
  3    inspect, release: no such key; outbox unpark, discard: no such parked
       message
  4    the inbox table does not exist (run "dedupe migrate up")
  75   the key is in flight elsewhere (a live lease); retry later
  76   run: the key is marked failed (attempts used up or --on-failure=poison);
       "dedupe release" it to allow another run
  77   run: the key was already used with a different command
  125  run: dedupe failed around the command (database error, lease lost)
  126  run: the command could not be started
  127  run: the command was not found
  N    run: any other status is the command's own (128+n: killed by signal n)
`

// exitCodeFor maps an error of a subcommand other than run to its exit code.
func exitCodeFor(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue), errors.Is(err, dedupe.ErrInvalidKey), errors.Is(err, dedupe.ErrInvalidConfig):
		return exitUsage
	case errors.Is(err, dedupe.ErrNotFound):
		return exitNotFound
	case errors.Is(err, dedupe.ErrNotMigrated):
		return exitNotMigrated
	case errors.Is(err, dedupe.ErrInFlight):
		return exitInFlight
	}
	return exitError
}
