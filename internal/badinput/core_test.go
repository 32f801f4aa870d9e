package badinput_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
)

// badKeys are the refused scopes and keys with the reason each must carry.
var badKeys = []struct {
	name   string
	key    dedupe.Key
	field  string // KeyError.Field
	reason error
}{
	{"empty key", dedupe.Key{Scope: "s", ID: ""}, "key", dedupe.ErrKeyEmpty},
	{"empty scope", dedupe.Key{Scope: "", ID: "k"}, "scope", dedupe.ErrKeyEmpty},
	{"key of 256 bytes", dedupe.Key{Scope: "s", ID: strings.Repeat("k", 256)}, "key", dedupe.ErrKeyTooLong},
	{"key of 128 two-byte runes (256 bytes)", dedupe.Key{Scope: "s", ID: strings.Repeat("é", 128)}, "key", dedupe.ErrKeyTooLong},
	{"scope of 256 bytes", dedupe.Key{Scope: strings.Repeat("s", 256), ID: "k"}, "scope", dedupe.ErrKeyTooLong},
	{"NUL in key", dedupe.Key{Scope: "s", ID: "a\x00b"}, "key", dedupe.ErrKeyInvalidChar},
	{"newline in key", dedupe.Key{Scope: "s", ID: "a\nb"}, "key", dedupe.ErrKeyInvalidChar},
	{"tab in key", dedupe.Key{Scope: "s", ID: "a\tb"}, "key", dedupe.ErrKeyInvalidChar},
	{"carriage return in key", dedupe.Key{Scope: "s", ID: "a\rb"}, "key", dedupe.ErrKeyInvalidChar},
	{"escape in key", dedupe.Key{Scope: "s", ID: "a\x1b[31m"}, "key", dedupe.ErrKeyInvalidChar},
	{"DEL in key", dedupe.Key{Scope: "s", ID: "a\x7f"}, "key", dedupe.ErrKeyInvalidChar},
	{"C1 control in key", dedupe.Key{Scope: "s", ID: "a\u0085b"}, "key", dedupe.ErrKeyInvalidChar},
	{"invalid UTF-8 in key", dedupe.Key{Scope: "s", ID: "a\xffb"}, "key", dedupe.ErrKeyInvalidChar},
	{"truncated UTF-8 in key", dedupe.Key{Scope: "s", ID: "a\xc3"}, "key", dedupe.ErrKeyInvalidChar},
	{"control char in scope", dedupe.Key{Scope: "s\x00", ID: "k"}, "scope", dedupe.ErrKeyInvalidChar},
	{"invalid UTF-8 in scope", dedupe.Key{Scope: "\xfe", ID: "k"}, "scope", dedupe.ErrKeyInvalidChar},
}

// entryPoints are every API that takes a key, each returning its error.
var entryPoints = []struct {
	name string
	call func(ctx context.Context, e *env, k dedupe.Key) error
}{
	{"Key.Validate", func(_ context.Context, _ *env, k dedupe.Key) error { return k.Validate() }},
	{"Inbox.Claim", func(ctx context.Context, e *env, k dedupe.Key) error {
		return pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			_, err := e.inbox.Claim(ctx, tx, k)
			return err
		})
	}},
	{"Inbox.ClaimBatch", func(ctx context.Context, e *env, k dedupe.Key) error {
		return pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			// A good key before the bad one must not be claimed either.
			_, err := e.inbox.ClaimBatch(ctx, tx, []dedupe.Key{{Scope: "s", ID: "good"}, k})
			return err
		})
	}},
	{"Inbox.Begin", func(ctx context.Context, e *env, k dedupe.Key) error {
		_, err := e.inbox.Begin(ctx, k)
		return err
	}},
	{"Inbox.Lookup", func(ctx context.Context, e *env, k dedupe.Key) error {
		_, err := e.inbox.Lookup(ctx, k)
		return err
	}},
	{"Inbox.Release", func(ctx context.Context, e *env, k dedupe.Key) error { return e.inbox.Release(ctx, k) }},
	{"Consumer.Handle", func(ctx context.Context, e *env, k dedupe.Key) error {
		ran := false
		c, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[string]{
			Scope: "s", Key: func(string) (string, error) { return k.ID, nil },
		}, func(ctx context.Context, tx pgx.Tx, id string) error { ran = true; return effect(ctx, tx, id) })
		if err != nil {
			if k.Scope == "s" {
				return err
			}
			return nil // scope refusals are NewConsumer's, tested below
		}
		outcome, err := c.Handle(ctx, "msg")
		if ran || outcome != 0 {
			return errors.Join(err, errors.New("handler ran or outcome set"))
		}
		return err
	}},
}

func TestEveryEntryPointRefusesBadKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	for _, ep := range entryPoints {
		for _, bk := range badKeys {
			if ep.name == "Consumer.Handle" && bk.field == "scope" {
				continue
			}
			err := ep.call(ctx, e, bk.key)
			if !errors.Is(err, dedupe.ErrInvalidKey) || !errors.Is(err, bk.reason) {
				t.Errorf("%s(%s): err = %v, want ErrInvalidKey and %v", ep.name, bk.name, err, bk.reason)
				continue
			}
			var ke *dedupe.KeyError
			if !errors.As(err, &ke) || ke.Field != bk.field || !errors.Is(ke.Reason, bk.reason) {
				t.Errorf("%s(%s): KeyError = %+v, want field %q reason %v", ep.name, bk.name, ke, bk.field, bk.reason)
			}
			if len(ke.Value) > 64+len("…") {
				t.Errorf("%s(%s): KeyError.Value of %d bytes is not truncated for display", ep.name, bk.name, len(ke.Value))
			}
		}
	}
	e.assertNothingWritten(t)
}

// TestKeyBoundariesAccepted is the control: the longest and the most unusual
// valid keys are claimed, so the refusals above are about the defect alone.
func TestKeyBoundariesAccepted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	for _, k := range []dedupe.Key{
		{Scope: strings.Repeat("s", 255), ID: strings.Repeat("k", 255)},
		{Scope: "s", ID: strings.Repeat("é", 127) + "k"},
		{Scope: "s", ID: "日本語 key with spaces/and:punctuation"},
		{Scope: "s", ID: "🙂"},
	} {
		c, err := e.inbox.Begin(ctx, k)
		if err != nil || c.Outcome != dedupe.OutcomeClaimed {
			t.Errorf("Begin(%q): %v, %v; want claimed", k.ID, c, err)
		}
	}
	if n := e.db.Count(t, "SELECT count(*) FROM dedupe_inbox"); n != 4 {
		t.Fatalf("inbox rows = %d, want 4", n)
	}
}

func TestConfigRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := func(ctx context.Context, tx pgx.Tx, id string) error { return effect(ctx, tx, id) }
	key := func(id string) (string, error) { return id, nil }
	cases := []struct {
		name  string
		call  func() error
		field string
	}{
		{"New with nil db", func() error { _, err := dedupe.New(nil, dedupe.Config{}); return err }, "db"},
		{"negative Lease", func() error { _, err := dedupe.New(e.db.Pool, dedupe.Config{Lease: -time.Second}); return err }, "Lease"},
		{"negative Retention", func() error {
			_, err := dedupe.New(e.db.Pool, dedupe.Config{Retention: -time.Hour})
			return err
		}, "Retention"},
		{"Retention shorter than Lease", func() error {
			_, err := dedupe.New(e.db.Pool, dedupe.Config{Lease: time.Hour, Retention: time.Minute})
			return err
		}, "Retention"},
		{"negative PurgeBatchSize", func() error {
			_, err := dedupe.New(e.db.Pool, dedupe.Config{PurgeBatchSize: -1})
			return err
		}, "PurgeBatchSize"},
		{"Table of 56 bytes", func() error {
			_, err := dedupe.New(e.db.Pool, dedupe.Config{Table: strings.Repeat("t", 56)})
			return err
		}, "Table"},
		{"NewMigrator with nil db", func() error { _, err := dedupe.NewMigrator(nil, dedupe.MigrateConfig{}); return err }, "db"},
		{"Migrate with a bad config", func() error {
			return dedupe.Migrate(context.Background(), e.db.Pool, dedupe.MigrateConfig{OutboxTable: strings.Repeat("t", 49)})
		}, "OutboxTable"},
		{"PlainSQL with a bad config", func() error {
			_, err := dedupe.PlainSQL(dedupe.MigrateConfig{Lines: []dedupe.Line{"nope"}})
			return err
		}, "Lines"},
		{"NewConsumer with nil inbox", func() error {
			_, err := dedupe.NewConsumer(nil, dedupe.ConsumerConfig[string]{Scope: "s", Key: key}, h)
			return err
		}, "inbox"},
		{"NewConsumer with nil handler", func() error {
			_, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[string]{Scope: "s", Key: key}, dedupe.HandlerFunc[string](nil))
			return err
		}, "handler"},
		{"NewConsumer without Key", func() error {
			_, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[string]{Scope: "s"}, h)
			return err
		}, "Key"},
		{"NewConsumer with negative LockTimeout", func() error {
			_, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[string]{Scope: "s", Key: key, LockTimeout: -1}, h)
			return err
		}, "LockTimeout"},
		{"NewConsumer with empty Scope", func() error {
			_, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[string]{Key: key}, h)
			return err
		}, "Scope"},
		{"NewConsumer with a control char in Scope", func() error {
			_, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[string]{Scope: "s\n", Key: key}, h)
			return err
		}, "Scope"},
		{"NewConsumer with a 256-byte Scope", func() error {
			_, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[string]{Scope: strings.Repeat("s", 256), Key: key}, h)
			return err
		}, "Scope"},
	}
	tables := func() int {
		return e.db.Count(t, "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1", e.db.Schema)
	}
	before := tables()
	for _, c := range cases {
		err := c.call()
		var ce *dedupe.ConfigError
		if !errors.Is(err, dedupe.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%s: err = %v, want a *ConfigError for field %q matching ErrInvalidConfig", c.name, err, c.field)
		}
	}
	e.assertNothingWritten(t)
	if n := tables(); n != before {
		t.Errorf("tables in the schema = %d, want %d: a refused config created one", n, before)
	}
}

// TestLeaseMisuseRefused: Complete, CompleteTx, Fail and Extend need a claim
// this attempt holds.
func TestLeaseMisuseRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	notHeld := []struct {
		name  string
		claim *dedupe.Claim
	}{
		{"nil claim", nil},
		{"duplicate claim", &dedupe.Claim{Key: dedupe.Key{Scope: "s", ID: "k"}, Outcome: dedupe.OutcomeDuplicate}},
		{"in-flight claim", &dedupe.Claim{Key: dedupe.Key{Scope: "s", ID: "k"}, Outcome: dedupe.OutcomeInFlight}},
		{"claimed but never stored", &dedupe.Claim{Key: dedupe.Key{Scope: "s", ID: "k"}, Outcome: dedupe.OutcomeClaimed, Token: 42}},
	}
	for _, c := range notHeld {
		calls := map[string]error{
			"Complete": e.inbox.Complete(ctx, c.claim, dedupe.Result{Status: 200}),
			"CompleteTx": pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
				return e.inbox.CompleteTx(ctx, tx, c.claim, dedupe.Result{})
			}),
			"Extend": e.inbox.Extend(ctx, c.claim, time.Minute),
		}
		_, calls["Fail"] = e.inbox.Fail(ctx, c.claim, errors.New("boom"))
		for name, err := range calls {
			if !errors.Is(err, dedupe.ErrLeaseLost) {
				t.Errorf("%s(%s): err = %v, want ErrLeaseLost", name, c.name, err)
			}
		}
	}
	if err := e.inbox.Release(ctx, dedupe.Key{Scope: "s", ID: "absent"}); !errors.Is(err, dedupe.ErrNotFound) {
		t.Errorf("Release(absent) = %v, want ErrNotFound", err)
	}
	if _, err := e.inbox.Lookup(ctx, dedupe.Key{Scope: "s", ID: "absent"}); !errors.Is(err, dedupe.ErrNotFound) {
		t.Errorf("Lookup(absent) = %v, want ErrNotFound", err)
	}
	e.assertNothingWritten(t)
}

// TestKeyFuncErrorRefused: a consumer whose key function fails writes
// nothing and returns ErrNoKey wrapping the function's error.
func TestKeyFuncErrorRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	errNoID := errors.New("message has no id")
	ran := false
	c, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[string]{
		Scope: "s", Key: func(string) (string, error) { return "", errNoID },
	}, func(ctx context.Context, tx pgx.Tx, id string) error { ran = true; return effect(ctx, tx, id) })
	if err != nil {
		t.Fatal(err)
	}
	outcome, err := c.Handle(context.Background(), "m")
	if !errors.Is(err, dedupe.ErrNoKey) || !errors.Is(err, errNoID) || outcome != 0 || ran {
		t.Fatalf("Handle = %v, %v (ran %v); want ErrNoKey wrapping the key function's error, no outcome, no run", outcome, err, ran)
	}
	if _, err := c.KeyOf("m"); !errors.Is(err, dedupe.ErrNoKey) {
		t.Fatalf("KeyOf = %v, want ErrNoKey", err)
	}
	e.assertNothingWritten(t)
}

// TestFingerprintConflictRefused: the same key with another payload is
// refused with ErrConflict and the stored row is left as it was.
func TestFingerprintConflictRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	first, err := e.inbox.Begin(ctx, dedupe.Key{Scope: "s", ID: "k", Fingerprint: []byte("pay 19.00")})
	if err != nil || first.Outcome != dedupe.OutcomeClaimed {
		t.Fatalf("first Begin: %v, %v", first, err)
	}
	if err := e.inbox.Complete(ctx, first, dedupe.Result{Status: 201, Body: []byte("created")}); err != nil {
		t.Fatal(err)
	}
	ran := false
	c, err := dedupe.NewConsumer(e.inbox, dedupe.ConsumerConfig[string]{
		Scope: "s", Key: func(string) (string, error) { return "k", nil },
		Fingerprint: func(body string) []byte { return []byte(body) },
	}, func(ctx context.Context, tx pgx.Tx, id string) error { ran = true; return effect(ctx, tx, id) })
	if err != nil {
		t.Fatal(err)
	}
	outcome, err := c.Handle(ctx, "pay 1900.00")
	if outcome != dedupe.OutcomeConflict || !errors.Is(err, dedupe.ErrConflict) || ran {
		t.Fatalf("Handle = %v, %v (ran %v); want conflict", outcome, err, ran)
	}
	second, err := e.inbox.Begin(ctx, dedupe.Key{Scope: "s", ID: "k", Fingerprint: []byte("other")})
	if err != nil || second.Outcome != dedupe.OutcomeConflict || second.Result != nil || !errors.Is(second.Outcome.Err(), dedupe.ErrConflict) {
		t.Fatalf("Begin with another fingerprint = %+v, %v; want conflict without the stored result", second, err)
	}
	rec, err := e.inbox.Lookup(ctx, dedupe.Key{Scope: "s", ID: "k"})
	if err != nil || rec.State != dedupe.StateComplete || string(rec.Key.Fingerprint) != "pay 19.00" || rec.Attempts != 1 {
		t.Fatalf("stored row = %+v, %v; want it unchanged", rec, err)
	}
	if n := e.db.Count(t, "SELECT count(*) FROM effects"); n != 0 {
		t.Fatalf("effects = %d, want 0", n)
	}
}
