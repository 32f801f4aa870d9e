package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/outbox"
)

// TestOutboxParkedUnparkDiscard drives the outbox commands against a parked
// message: list it, refuse to discard without --yes or --reason, discard it
// with the record stored in its row, and report exit 3 for unknown IDs.
func TestOutboxParkedUnparkDiscard(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	ob, err := outbox.New(e.db.Pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		for _, p := range []string{"poison", "next"} {
			id, err := ob.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "o-1", Payload: []byte(p)})
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, outbox.PublishFunc(func(_ context.Context, m *outbox.StoredMessage) error {
		if string(m.Payload) == "poison" {
			return dedupe.Permanent(errors.New("no such topic\nsecond line"))
		}
		return nil
	}), outbox.RelayConfig{DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.Cycle(ctx); n != 0 || err != nil {
		t.Fatalf("cycle = %d, %v", n, err)
	}

	r := e.cli(t, "outbox", "parked")
	if r.code != 0 || !strings.Contains(r.stdout, ids[0]) || !strings.Contains(r.stdout, "no such topic") || strings.Contains(r.stdout, "second line") {
		t.Fatalf("parked = %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var listed struct {
		Parked []outboxMessageJSON `json:"parked"`
	}
	r = e.cli(t, "--json", "outbox", "parked")
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed.Parked) != 1 || listed.Parked[0].Attempts != 1 ||
		listed.Parked[0].Key != "o-1" || listed.Parked[0].ParkedAt.IsZero() {
		t.Fatalf("parked --json = %+v, %v\n%s", listed, err, r.stdout)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"outbox"}, exitUsage, "which action"},
		{[]string{"outbox", "frob"}, exitUsage, "unknown action"},
		{[]string{"outbox", "unpark"}, exitUsage, "needs --id"},
		{[]string{"outbox", "discard", "--id", ids[0]}, exitUsage, "needs --reason"},
		{[]string{"outbox", "discard", "--id", ids[0], "--reason", "cancelled"}, exitUsage, "pass --yes"},
		{[]string{"outbox", "discard", "--id", ids[1], "--reason", "x", "--yes"}, exitNotFound, "dedupe outbox: no parked outbox message"},
		{[]string{"outbox", "unpark", "--id", "nope"}, exitNotFound, "dedupe outbox: no parked outbox message \"nope\"\n"},
	} {
		if r := e.cli(t, c.args...); r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.want) {
			t.Errorf("dedupe %q = %d, want %d with %q\n%s%s", c.args, r.code, c.code, c.want, r.stdout, r.stderr)
		}
	}
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE parked_at IS NOT NULL AND published_at IS NULL"); n != 1 {
		t.Fatal("a refused discard changed the row")
	}

	var out struct {
		Discarded outboxMessageJSON `json:"discarded"`
	}
	r = e.cli(t, "--json", "outbox", "discard", "--id", ids[0], "--reason", "INC-7: order cancelled", "--by", "alice", "--yes")
	if err := json.Unmarshal([]byte(r.stdout), &out); r.code != 0 || err != nil || out.Discarded.ID != ids[0] ||
		out.Discarded.DiscardedBy != "alice" || out.Discarded.DiscardedAt.IsZero() {
		t.Fatalf("discard = %d %+v %v\n%s%s", r.code, out, err, r.stdout, r.stderr)
	}
	if n := e.db.Count(t, `SELECT count(*) FROM dedupe_outbox WHERE message_id = $1 AND discarded_by = 'alice'
		AND discard_reason = 'INC-7: order cancelled' AND discarded_at IS NOT NULL`, ids[0]); n != 1 {
		t.Fatal("the discard is not recorded in the row")
	}
	if r := e.cli(t, "outbox", "parked"); r.code != 0 || !strings.Contains(r.stdout, "nothing parked") {
		t.Fatalf("parked after discard = %d\n%s", r.code, r.stdout)
	}
	// The key moves up.
	if n, err := relay.Cycle(ctx); n != 1 || err != nil {
		t.Fatalf("cycle after discard = %d, %v", n, err)
	}

	// unpark: park the next one by hand and hand it back; --by defaults to the OS user.
	e.db.Exec(t, "UPDATE dedupe_outbox SET published_at = NULL, parked_at = now(), attempts = 3 WHERE message_id = $1", ids[1])
	if r := e.cli(t, "outbox", "unpark", "--id", ids[1]); r.code != 0 || !strings.Contains(r.stdout, "unparked") {
		t.Fatalf("unpark = %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE message_id = $1 AND parked_at IS NULL AND attempts = 0", ids[1]); n != 1 {
		t.Fatal("unpark did not hand the message back")
	}
	e.db.Exec(t, "UPDATE dedupe_outbox SET parked_at = now() WHERE message_id = $1", ids[1])
	if r := e.cli(t, "outbox", "discard", "--id", ids[1], "--reason", "test", "--yes"); r.code != 0 || !strings.Contains(r.stdout, "discarded") {
		t.Fatalf("discard = %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_outbox WHERE message_id = $1 AND discarded_by <> ''", ids[1]); n != 1 {
		t.Fatal("no default --by recorded")
	}
}
