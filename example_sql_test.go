package dedupe_test

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/exactlyonce/dedupe"
)

// An application on database/sql wraps its *sql.DB with SQL; its handler
// receives a *sql.Tx holding the claim, for sqlc, GORM, Bun or plain
// database/sql code.
func ExampleSQL() {
	ctx := context.Background()
	pool, cleanup := exampleDB()
	defer cleanup()
	db := stdlib.OpenDBFromPool(pool) // or sql.Open("pgx", url), sql.Open("postgres", url) with lib/pq
	defer db.Close()

	sqldb := dedupe.SQL(db)
	if err := dedupe.Migrate(ctx, sqldb, dedupe.MigrateConfig{}); err != nil {
		panic(err)
	}
	_, _ = db.ExecContext(ctx, `CREATE TABLE charges (order_id text, cents int)`)
	inbox, _ := dedupe.New(sqldb, dedupe.Config{})

	consumer, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{
		Scope: "billing",
		Key:   func(orderID string) (string, error) { return orderID, nil },
	}, func(ctx context.Context, tx *sql.Tx, orderID string) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO charges VALUES ($1, 1900)`, orderID)
		return err
	})
	if err != nil {
		panic(err)
	}
	for range 2 {
		fmt.Println(consumer.Handle(ctx, "ord_1"))
	}
	var charges int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM charges`).Scan(&charges)
	fmt.Println("charges:", charges)
	// Output:
	// claimed <nil>
	// duplicate <nil>
	// charges: 1
}
