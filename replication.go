package dedupe

import (
	"context"
	"fmt"
)

// Replication is what CheckReplication learnt of the database's
// replication: whether a commit, and so the ack a transport sends after it,
// survives a failover to a standby.
type Replication struct {
	// Standbys is how many standbys stream from the database
	// (pg_stat_replication).
	Standbys int
	// SyncStandbyNames is the server's synchronous_standby_names: "" when
	// no standby is synchronous.
	SyncStandbyNames string
	// SynchronousCommit is the claim transaction's synchronous_commit: the
	// consumer's ConsumerConfig.SynchronousCommit, else the server's (or
	// the connection's) setting.
	SynchronousCommit string
}

// Synchronous reports whether a COMMIT waits until a standby has it: a
// standby is named in synchronous_standby_names and synchronous_commit is
// on, remote_apply or remote_write (remote_write: in the standby's
// operating system, not yet on its disk; it survives the primary's failure,
// not the standby's machine's at the same time).
func (r Replication) Synchronous() bool {
	switch r.SynchronousCommit {
	case "on", "remote_apply", "remote_write":
		return r.SyncStandbyNames != ""
	}
	return false
}

// AckMayBeLost reports the case CheckReplication warns of: a standby
// streams, so a failover may promote it, and a commit does not wait for
// it, so a message acknowledged after its commit may lose its effect.
func (r Replication) AckMayBeLost() bool { return r.Standbys > 0 && !r.Synchronous() }

// CheckReplication reads the database's replication settings, meant for a
// consumer's startup, and logs a warning on the inbox's Logger when a
// standby streams but replication is asynchronous: a commit acknowledged
// to the broker may not have reached the standby, and a failover to it
// loses that message's effect while the broker holds it done. Set
// synchronous_standby_names on the server and synchronous_commit (on the
// server, or for the claim's transaction only with
// ConsumerConfig.SynchronousCommit) to on or remote_apply; see
// docs/reliability.md.
//
// It runs one read-only query; pg_stat_replication shows its rows to any
// user.
func (d *txDriver) CheckReplication(ctx context.Context) (Replication, error) {
	r, err := d.inbox.replication(ctx)
	if err != nil {
		return r, err
	}
	if d.syncCommit != "" {
		r.SynchronousCommit = d.syncCommit
	}
	if r.AckMayBeLost() {
		d.inbox.cfg.Logger.WarnContext(ctx, "dedupe: a standby streams from the database but replication is asynchronous: "+
			"a failover may lose the effect of messages already acknowledged; set synchronous_standby_names and "+
			"synchronous_commit = on or remote_apply (ConsumerConfig.SynchronousCommit for the claim only)",
			"standbys", r.Standbys, "synchronous_standby_names", r.SyncStandbyNames,
			"synchronous_commit", r.SynchronousCommit)
	}
	return r, nil
}

// replication reads the server's replication settings.
func (i *Inbox) replication(ctx context.Context) (Replication, error) {
	var r Replication
	var n int64
	err := i.db.QueryRow(ctx, sqlReplication).Scan(&n, &r.SyncStandbyNames, &r.SynchronousCommit)
	if err != nil {
		return r, fmt.Errorf("dedupe: reading the replication settings: %w", translate(err))
	}
	r.Standbys = int(n)
	return r, nil
}
