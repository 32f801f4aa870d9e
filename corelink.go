package dedupe

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe/internal/corelink"
)

// The outbox package imports this one and reaches the drivers, the error
// translation and the key rules through internal/corelink, never the
// reverse: this package does not know the outbox.
func init() {
	corelink.NewDriver = func(db any) (corelink.Driver, error) {
		d, _ := db.(DB)
		drv, err := newDriver(d)
		if err != nil {
			return nil, err
		}
		return linkedDriver{drv}, nil
	}
	corelink.Translate = translate
	corelink.ValidatePart = validatePart
}

// linkedDriver is a driver as corelink.Driver.
type linkedDriver struct{ d driver }

func (l linkedDriver) NewBatch(opts pgx.TxOptions) *pgx.Batch { return l.d.newBatch(opts) }
func (l linkedDriver) ListenPool() *pgxpool.Pool              { return l.d.listenPool() }

func (l linkedDriver) Begin(ctx context.Context, opts pgx.TxOptions, b *pgx.Batch) (corelink.Tx, error) {
	tx, err := l.d.begin(ctx, opts, b)
	if err != nil {
		return nil, err
	}
	return tx, nil
}
