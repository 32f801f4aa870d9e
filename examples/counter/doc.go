// Package counter is a dedupe.Observer that counts what the examples' inboxes
// and adapters report, for their reports and closing log lines: handlings by
// outcome and transport events by name. A program that wants metrics uses
// dedupeotel (see examples/telemetry) instead, or beside it with
// dedupe.Observers.
//
// It is public, like the rest of what the examples import, so that a program
// copied out of examples/ builds.
//
// It is a library that the examples share, not an example: there is nothing
// to run here (the programs are the directories of examples/ that have a
// README).
package counter
