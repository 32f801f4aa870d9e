// Package exampledb is how every example finds PostgreSQL: the one flag
// (-database-url), the one variable (DATABASE_URL) and the one local
// fallback (LocalURL), what to say when nothing answers, and the schema a
// demo that runs and exits works in (SchemaName, InSchema, -keep-schema).
//
// It is an ordinary public package (it does not import testing), so a
// program copied from an example keeps building.
//
// It is a library that the examples share, not an example: there is nothing
// to run here (the programs are the directories of examples/ that have a
// README).
package exampledb
