package test

import (
	"os"
	"testing"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	dbtest.VerifyTestMain(m)
}
