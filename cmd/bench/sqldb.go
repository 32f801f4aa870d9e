package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/exactlyonce/dedupe"
)

// sqlBench is the database/sql side of the benchmark: a *sql.DB over pgx's
// stdlib driver, dialled through the same counting dialer as the pgx pool
// (so its round trips are writes to its sockets too, and its backends carry
// the pool's application_name, so their CPU is counted), and a Consumer
// over dedupe.SQL whose handler receives a *sql.Tx.
type sqlBench struct {
	db       *sql.DB
	consumer *dedupe.Consumer[string]
}

// openSQL opens the database/sql side on first use, with as many
// connections as the pgx pool, all of them opened before any window (as the
// pool's MinConns does), so that no window counts a connection's setup.
// It opens as many connections again as the pgx pool holds.
func (b *bench) openSQL(ctx context.Context) error {
	if b.sql != nil {
		return nil
	}
	if b.connConfig == nil {
		return errors.New("bench: no connection config for the database/sql rows")
	}
	// No liveness ping either (stdlib pings a connection unused for a
	// second): see the pool's ShouldPing.
	db := stdlib.OpenDB(*b.connConfig.Copy(), stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return false }))
	n := int(b.pool.Config().MaxConns)
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n) // the default keeps 2 idle: more workers would reconnect
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			_ = db.Close()
			return fmt.Errorf("database/sql: %w", err)
		}
		conns = append(conns, c)
	}
	inbox, err := dedupe.New(dedupe.SQL(db), dedupe.Config{})
	if err != nil {
		_ = db.Close()
		return err
	}
	c, err := dedupe.NewConsumer(inbox, dedupe.ConsumerConfig[string]{
		Scope: benchScope,
		Key:   func(id string) (string, error) { return id, nil },
	}, func(ctx context.Context, tx *sql.Tx, id string) error {
		_, err := tx.ExecContext(ctx, sqlEffect, id, body)
		return err
	})
	if err != nil {
		_ = db.Close()
		return err
	}
	b.sql = &sqlBench{db: db, consumer: c}
	return nil
}

// closeSQL closes the database/sql side if it was opened.
func (b *bench) closeSQL() {
	if b.sql != nil {
		_ = b.sql.db.Close()
		b.sql = nil
	}
}

func (b *bench) opSQLHandle(ctx context.Context, _ int) (int, error) {
	outcome, err := b.sql.consumer.Handle(ctx, b.nextID())
	if err == nil && outcome != dedupe.OutcomeClaimed {
		err = fmt.Errorf("bench: outcome %s for a new key", outcome)
	}
	return 1, err
}

func (b *bench) opSQLHandleDup(ctx context.Context, _ int) (int, error) {
	outcome, err := b.sql.consumer.Handle(ctx, b.dupID())
	if err == nil && outcome != dedupe.OutcomeDuplicate {
		err = fmt.Errorf("bench: outcome %s for a committed key", outcome)
	}
	return 1, err
}

func (b *bench) opSQLHandClaimEffect(ctx context.Context, _ int) (int, error) {
	claimed, err := b.sqlHandClaimEffectTx(ctx, benchScope, b.nextID())
	if err == nil && !claimed {
		err = errors.New("bench: a new key was taken")
	}
	return 1, err
}

func (b *bench) opSQLHandDup(ctx context.Context, _ int) (int, error) {
	claimed, err := b.sqlHandClaimEffectTx(ctx, benchScope, b.dupID())
	if err == nil && claimed {
		err = errors.New("bench: a committed key was claimed again")
	}
	return 1, err
}

// sqlHandClaimEffectTx is handClaimEffectTx written with database/sql: the
// same statements in a *sql.Tx (BEGIN, the claim, the effect or the read
// of the taken key's row, COMMIT), rolled back on an error.
func (b *bench) sqlHandClaimEffectTx(ctx context.Context, scope, id string) (claimed bool, err error) {
	now := time.Now()
	tx, err := b.sql.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	var one int
	err = tx.QueryRowContext(ctx, sqlHandClaim, scope, id, now, now.Add(dedupe.DefaultRetention)).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		err = classifyHand(tx.QueryRowContext(ctx, sqlHandClassify, scope, id), id)
	case err == nil:
		claimed = true
		_, err = tx.ExecContext(ctx, sqlEffect, id, body)
	}
	if err != nil {
		_ = tx.Rollback()
		return false, err
	}
	return claimed, tx.Commit()
}
