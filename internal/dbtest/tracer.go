package dbtest

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// NopTracer is a pgx query tracer that records nothing: set as a pool's
// ConnConfig.Tracer, its presence alone sends a Consumer's claim through
// pgx's batch instead of the direct claim round.
type NopTracer struct{}

// TraceQueryStart returns ctx.
func (NopTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd does nothing.
func (NopTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
