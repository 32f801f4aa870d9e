package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// LISTEN/NOTIFY: Enqueue sends a notification on the table's channel, which
// PostgreSQL delivers when the transaction commits; a relay listening on a
// dedicated connection runs a cycle at once instead of waiting for its next
// poll. Polling stays the fallback (and the pace of retries).

// listen keeps a LISTEN connection open and signals wake on every
// notification, reconnecting with backoff when it fails. Each (re)connect
// signals too, so nothing committed while it was not listening is missed
// until the next poll.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	pause := time.Duration(0)
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		pause = r.nextPause(pause)
		r.cfg.Logger.WarnContext(ctx, "dedupe: outbox relay LISTEN failed; polling meanwhile", "err", err, "retry_in", pause)
		t := time.NewTimer(r.jitter(pause))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := r.cfg.ListenConn(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// The channel is named after the table's oid, looked up on this
	// connection at every (re)connect.
	var channel string
	if err := conn.QueryRow(ctx, r.ob.q.channel, r.ob.table).Scan(&channel); err != nil {
		return translate(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	signal(wake)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		signal(wake)
	}
}

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
