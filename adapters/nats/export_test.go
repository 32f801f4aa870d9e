package dedupenats

import "github.com/nats-io/nats.go/jetstream"

// SetBeforeAck installs a hook that runs between the commit and the ack, for
// tests that stop a consumer there.
func SetBeforeAck(r *Runner, f func(msg jetstream.Msg)) { r.beforeAck = f }
