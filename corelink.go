package dedupe

import "github.com/exactlyonce/dedupe/internal/corelink"

// The outbox package imports this one and reaches the drivers, the error
// translation and the key rules through internal/corelink, never the
// reverse: this package does not know the outbox.
func init() {
	corelink.NewDriver = func(db any) (corelink.Driver, error) {
		d, _ := db.(DB)
		return newDriver(d)
	}
	corelink.Translate = translate
	corelink.ValidatePart = validatePart
}
