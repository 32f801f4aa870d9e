package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// keyState reads the state of an order's key in the consumer's inbox
// ("complete", "in_flight", "failed"), "" when the inbox does not hold it
// (or has no table yet), so that -publish can tell a new order from a
// duplicate.
func keyState(ctx context.Context, databaseURL, scope, key string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var state string
	err = conn.QueryRow(ctx, "SELECT state FROM dedupe_inbox WHERE scope = $1 AND key = $2", scope, key).Scan(&state)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42P01": // no row, no table
		return "", nil
	case err != nil:
		return "", err
	}
	return state, nil
}

// verdict says what the consumer made of an acknowledged order, from its
// key's state in the inbox before the publish and after the acknowledgement.
func verdict(before, after string, beforeErr, afterErr error) string {
	switch {
	case beforeErr != nil || afterErr != nil:
		return fmt.Sprintf("outcome unknown (the inbox could not be read: %v)", errors.Join(beforeErr, afterErr))
	case before == "complete":
		return "a duplicate: already shipped, not shipped again"
	case after == "complete":
		return "new: shipped"
	case after == "failed":
		return "failed: the inbox marked it failed (dedupe inspect)"
	}
	return "state " + after
}
