package dbtest

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// NopTracer is a pgx query and batch tracer that records nothing: set as a
// pool's ConnConfig.Tracer, its presence alone sends a Consumer's claim
// through pgx's batch instead of the direct claim round. A test's tracer
// embeds it and overrides what it records.
type NopTracer struct{}

// TraceQueryStart returns ctx.
func (NopTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd does nothing.
func (NopTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart returns ctx.
func (NopTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery does nothing.
func (NopTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (NopTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
