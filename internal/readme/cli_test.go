//go:build unix

package readme

import (
	"os"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// TestCLI runs the scripts of testdata/cli against the dedupe binary, built
// once from cmd/dedupe: each command as its help and the README document
// it (output, exit codes, what it leaves in the tables), on a schema of the
// script's own.
func TestCLI(t *testing.T) {
	base := dbtest.BaseURL(t)
	bin := buildCLI(t)
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/cli",
		Deadline:            deadline(t),
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(env *testscript.Env) error {
			url, err := schemaURL(env, base)
			if err != nil {
				return err
			}
			return setenv(env, "DATABASE_URL="+url, "PATH="+bin+string(os.PathListSeparator)+env.Getenv("PATH"))
		},
		Cmds: commands(),
	})
}
