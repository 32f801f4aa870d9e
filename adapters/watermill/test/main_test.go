package test

import (
	"os"
	"testing"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(victimEnv) != "" {
		os.Exit(victim())
	}
	dbtest.VerifyTestMain(m)
}
