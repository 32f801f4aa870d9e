// Package dedupe gives at-least-once consumers exactly-once effects.
//
// Every consumer of a queue, a webhook or an API receives the same message
// twice sooner or later. dedupe claims the message's key in a PostgreSQL
// inbox table inside the same transaction as the consumer's own writes, so
// the claim and the effects commit together or not at all; a duplicate finds
// the committed claim and is skipped.
//
// This package is the inbox: its API, its migrations, its errors and its
// Observer. The transactional outbox is package outbox, the transports are
// the adapters' modules (adapters/nats, adapters/kafka, ...), and
// ARCHITECTURE.md at the repository's root maps them all.
//
// # Starting an inbox
//
// An Inbox is one inbox table reached through a DB: a pgx pool (the default
// and fastest; handlers receive a pgx.Tx), or a database/sql handle wrapped
// with SQL (handlers receive a *sql.Tx). The zero Config is usable:
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	...
//	inbox, err := dedupe.New(pool, dedupe.Config{})
//
// Build one Inbox per table and share it: it is safe for concurrent use.
//
// # Creating the tables
//
// Migrate creates and upgrades the inbox and outbox tables with numbered,
// embedded migrations, in one transaction under an advisory lock, so that
// many processes may call it at start:
//
//	err := dedupe.Migrate(ctx, pool, dedupe.MigrateConfig{})
//
// MigrateConfig names the schema, the tables and the lines to migrate;
// Config.Migration returns an inbox's own. NewMigrator adds Up, Down and
// Status; PlainSQL renders the schema for other migration tools.
//
// # Consuming messages
//
// A Consumer runs a handler for each message exactly once in effect. Its
// ConsumerConfig says how to read a message's key (an id every redelivery
// carries) and in which scope keys are unique:
//
//	consumer, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[Order]{
//		Scope: "billing",
//		Key:   func(o Order) (string, error) { return o.ID, nil },
//	}, func(ctx context.Context, tx pgx.Tx, o Order) error {
//		_, err := tx.Exec(ctx, `INSERT INTO charges ...`, o.ID, o.Cents)
//		return err
//	})
//
// The handler's transaction type is the driver's: pgx.Tx over pgx,
// *sql.Tx over SQL. NewConsumer refuses a handler of the other type with
// a *ConfigError, before any message is handled (ARCHITECTURE.md says why
// this is not a compile-time check).
//
// # Handling a message
//
// Handle begins a transaction, claims the message's key, runs the handler
// and commits, claim and effects together:
//
//	outcome, err := consumer.Handle(ctx, order)
//
// OutcomeClaimed: the handler ran and its effects committed; ack the
// message. OutcomeDuplicate: the key was handled before; ack it without
// running anything. A handler's error (a *HandlerError) rolls everything
// back and counts an attempt: redeliver later. After
// ConsumerConfig.MaxAttempts failures, or at once for a Permanent error,
// the key is marked failed: OutcomePoisoned with ErrPoisoned, and no
// delivery runs the handler again. Handle's documentation lists every
// outcome. The transport adapters call Handle for you and ack, retry or
// dead-letter by its outcome.
//
// # Other ways to claim
//
//   - Inbox.Claim joins a transaction you manage (Claim, then your writes,
//     then commit), for code that already owns its transactions, such as
//     the httpidem middleware.
//   - BatchConsumer claims a batch of messages in one transaction.
//   - Leased mode (Inbox.Begin, Complete, Fail) is for work whose side
//     effects cannot share the transaction (a call to a payment API): the
//     claim commits as in flight with a lease; a lease that expires lets a
//     retry take over, and the old holder's late completion is refused by a
//     fencing token. KeepAlive renews the lease.
//
// A key has three states: absent, in flight and complete, plus failed for
// a poison key whose attempts are used up. Keys are scoped: uniqueness is
// on (scope, key).
//
// # Keeping the table small
//
// Complete keys are kept for Config.Retention, within which a redelivery
// is recognised; Inbox.Purge and Inbox.RunPurger delete them after it, in
// bounded batches. Inbox.Stats counts keys per scope and state.
//
// # Observing
//
// Config.Observer is told of every handling (StartHandle and its done),
// lease renewal, purge and transport event; embed NopObserver to implement
// a part. The dedupeotel module implements it with OpenTelemetry. The
// outbox has its own hooks, outbox.Observer.
//
// # Errors
//
// Errors are typed and matched with errors.Is and errors.As: the sentinels
// (ErrInFlight, ErrPoisoned, ErrConflict, ErrNotMigrated, ErrInvalidConfig,
// ...) and the types that carry details (*ConfigError, *HandlerError,
// *KeyError, *OutcomeUnknownError). Permanent marks a handler's error as
// one retrying cannot fix.
package dedupe
