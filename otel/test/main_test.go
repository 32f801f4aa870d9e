// Package test holds the end-to-end trace tests of dedupeotel through the
// NATS and Kafka adapters: a module of its own, so that the brokers stay out
// of the dedupeotel module's requirements.
package test

import (
	"testing"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }
