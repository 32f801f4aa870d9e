package main

import (
	"context"
	"fmt"
	"io"
	"time"
)

// quiesce brings the server to rest before a row is measured, so that what
// the rows before it left behind is not billed to its first rounds: a
// CHECKPOINT writes out the dirty buffers they left (a checkpoint spread
// over the next rows otherwise), then it waits until no autovacuum worker
// runs (the batch rows leave tables for autovacuum to visit), at most
// -quiesce-wait. Both sides of the row then start from the same state, which
// their interleaved rounds keep. A server that refuses CHECKPOINT (a role
// without pg_checkpoint) is only waited for; -checkpoint=false leaves the
// CHECKPOINT out.
func (b *bench) quiesce(ctx context.Context, log io.Writer) {
	if b.opts.checkpoint {
		if _, err := b.pool.Exec(ctx, "CHECKPOINT"); err != nil {
			fmt.Fprintf(log, "bench: CHECKPOINT before the row: %v\n", err)
		}
	}
	wait := b.opts.quiesceWait
	deadline := time.Now().Add(wait)
	for {
		var workers int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'`).Scan(&workers)
		if err != nil {
			fmt.Fprintf(log, "bench: counting autovacuum workers before the row: %v\n", err)
			return
		}
		if workers == 0 || ctx.Err() != nil {
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(log, "bench: %d autovacuum workers still running after %v; measuring anyway\n", workers, wait)
			return
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}
