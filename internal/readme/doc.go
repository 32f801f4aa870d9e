// Package readme holds the tests that keep the repository's README and its
// operator CLI honest: every shell block of README.md and docs/*.md runs as written (in a
// copy of the repository, with its own database schema and free ports), and
// the commands of cmd/dedupe behave as documented. They are testscript
// scripts (github.com/rogpeppe/go-internal/testscript) under testdata/.
//
// The module is a test harness only; it has no API.
package readme
