package shipping

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestDecode: an order is read; a body that is no order is a permanent
// error that says why.
func TestDecode(t *testing.T) {
	o, err := Decode([]byte(`{"id":"order-1","item":"book","qty":2}`))
	if err != nil || o != (Order{ID: "order-1", Item: "book", Qty: 2}) {
		t.Fatalf("Decode = %+v, %v", o, err)
	}
	for body, want := range map[string]string{
		`not json`:                   "decode order: ",
		`{"item":"book","qty":1}`:    "invalid order {ID: Item:book Qty:1}",
		`{"id":"order-1","qty":0}`:   "invalid order {ID:order-1 Item: Qty:0}",
		`{"id":"order-1","qty":"x"}`: "decode order: ",
	} {
		_, err := Decode([]byte(body))
		if !dedupe.IsPermanent(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("Decode(%s) = %v, want a permanent error saying %q", body, err, want)
		}
	}
}

// TestCreateTableConcurrently: copies starting together all create the
// table without an error (CREATE TABLE IF NOT EXISTS alone can collide on
// the catalog), and a shipment inserted in a transaction is there after
// its commit, not after its rollback.
func TestCreateTableConcurrently(t *testing.T) {
	db := dbtest.New(t)
	ctx := context.Background()
	const copies = 8
	var wg sync.WaitGroup
	errs := make(chan error, copies)
	start := make(chan struct{})
	for range copies {
		wg.Go(func() {
			<-start
			errs <- CreateTable(ctx, db.Pool, Table)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("CreateTable: %v", err)
		}
	}
	o := Order{ID: "order-1", Item: "book", Qty: 3}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return Insert(ctx, tx, o) }); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := Insert(ctx, tx, Order{ID: "order-2", Item: "pen", Qty: 1}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if n := db.Count(t, "SELECT count(*) FROM shipments WHERE order_id = 'order-1' AND item = 'book' AND qty = 3"); n != 1 {
		t.Fatalf("committed shipments of order-1 = %d, want 1", n)
	}
	if n := db.Count(t, "SELECT count(*) FROM shipments"); n != 1 {
		t.Fatalf("shipments = %d, want 1 (the rolled back one is not there)", n)
	}
}
