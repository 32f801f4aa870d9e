//go:build unix

package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
	"github.com/rogpeppe/go-internal/txtar"

	"github.com/exactlyonce/dedupe/internal/dbtest"
)

// notRun lists the README's shell blocks that no script runs, each found by
// a line it contains, with the reason.
var notRun = map[string]string{
	"go test -race -count=1 github.com/exactlyonce/dedupe/...": "the test suite itself (.ci/run runs it); its quickstart line is the Quickstart block, which runs",
	"go run ./cmd/soak                      # or .ci/soak":     "minutes of fault injection; go test ./cmd/soak runs a short soak, and internal/badinput is part of the suite",
}

// TestREADMEBlocksRun runs every script of testdata/readme: each holds one
// shell block of README.md or docs/*.md, word for word (TestREADMEBlocksCovered checks
// that), and runs it with bash in a copy of the repository, with a schema
// of its own in DATABASE_URL and free ports in NATS_URL, KAFKA_BROKERS and
// ADDR, then checks what it printed and wrote. (The scripts build with
// -trimpath (goEnvVars), so the copies, each in its own directory, share
// one compilation of the repository's packages from the build cache.)
func TestREADMEBlocksRun(t *testing.T) {
	root := repoRoot(t)
	base := dbtest.BaseURL(t)
	goEnv := goEnvVars(t)
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/readme",
		Deadline:            deadline(t),
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(env *testscript.Env) error {
			if err := copyTree(root, env.WorkDir); err != nil {
				return err
			}
			home := filepath.Join(env.WorkDir, ".home")
			if err := os.Mkdir(home, 0o755); err != nil {
				return err
			}
			url, err := schemaURL(env, base)
			if err != nil {
				return err
			}
			bin := filepath.Join(env.WorkDir, "bin")
			vars := append([]string{"HOME=" + home, "DATABASE_URL=" + url, "GOBIN=" + bin,
				"PATH=" + bin + string(os.PathListSeparator) + env.Getenv("PATH")}, goEnv...)
			for _, name := range []string{"NATS_URL", "KAFKA_BROKERS", "ADDR"} {
				addr, err := freeAddr()
				if err != nil {
					return err
				}
				if name == "NATS_URL" {
					addr = "nats://" + addr
				}
				vars = append(vars, name+"="+addr)
			}
			return setenv(env, vars...)
		},
		Cmds: commands(),
	})
}

// docFiles are the Markdown files whose shell blocks run, relative to the
// repository root: README.md and docs/*.md.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	return append([]string{"README.md"}, globRel(t, root, "docs/*.md")...)
}

// globRel returns the files of root matching pattern (slash-separated),
// relative to root; it fails t when there are none.
func globRel(t *testing.T, root, pattern string) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pattern)))
	if err != nil || len(found) == 0 {
		t.Fatalf("no %s under %s (%v)", pattern, root, err)
	}
	var files []string
	for _, f := range found {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// TestREADMEBlocksCovered keeps the scripts and the files of docFiles in
// step: every sh block of those files is a .sh file of exactly one script,
// word for word, unless notRun says why not; every plain (output) block is
// a .out file of a script; and every .sh and .out file of the scripts is
// still in one of them.
func TestREADMEBlocksCovered(t *testing.T) {
	root := repoRoot(t)
	scripts, err := filepath.Glob("testdata/readme/*.txtar")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in testdata/readme (%v)", err)
	}
	files := map[string][]string{} // content → "script: file"
	for _, s := range scripts {
		a, err := txtar.ParseFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range a.Files {
			if ext := filepath.Ext(f.Name); ext == ".sh" || ext == ".out" {
				files[string(f.Data)] = append(files[string(f.Data)], filepath.Base(s)+": "+f.Name)
			}
		}
	}
	used := map[string]bool{}
	var all strings.Builder
	for _, doc := range docFiles(t, root) {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		all.Write(text)
		for _, b := range fencedBlocks(string(text)) {
			if b.lang != "sh" && b.lang != "" {
				continue
			}
			if why := skipped(b.text); why != "" && b.lang == "sh" {
				t.Logf("%s:%d not run: %s", doc, b.line, why)
				continue
			}
			in := files[b.text]
			switch {
			case len(in) == 0:
				t.Errorf("%s:%d: this %q block is in no script of testdata/readme (copy it word for word into a .sh or .out file of one, or list it in notRun with the reason):\n%s",
					doc, b.line, b.lang, b.text)
			case len(in) > 1:
				t.Errorf("%s:%d: block is in several scripts: %v", doc, b.line, in)
			}
			used[b.text] = true
		}
	}
	for text, in := range files {
		if !used[text] {
			t.Errorf("%v: not a block of README.md or docs/*.md any more (update it from there, or remove it):\n%s", in, text)
		}
	}
	for line := range notRun {
		if !strings.Contains(all.String(), line) {
			t.Errorf("notRun names %q, which neither README.md nor docs/*.md holds any more", line)
		}
	}
}

// skipped returns why the block is not run, or "".
func skipped(text string) string {
	for line, why := range notRun {
		if strings.Contains(text, line) {
			return why
		}
	}
	return ""
}

// TestExamplesImportNoInternal: a program copied out of examples/ must
// build, so no example imports an internal package of the repository
// (their tests may; the core's own internal packages come along with it).
func TestExamplesImportNoInternal(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "github.com/exactlyonce/dedupe/examples/...")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 6 {
		t.Fatalf("go list found %d example packages:\n%s", len(lines), out)
	}
	for _, line := range lines {
		fields := strings.Fields(line)
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, "github.com/exactlyonce/dedupe/") && (strings.Contains(imp, "/internal/") || strings.HasSuffix(imp, "/internal")) {
				t.Errorf("%s imports %s", fields[0], imp)
			}
		}
	}
}

// TestExamplesSayWhatTheyAre: every program of examples/ has a README that
// says where its tables go and what to do when something is missing, and
// says it the way its kind does: a demo that runs and exits works in a
// schema of its own and takes -keep-schema; a service names its tables
// and the DROP that removes them. Every other package directly under
// examples/ is a library the examples share, and its doc.go says so.
func TestExamplesSayWhatTheyAre(t *testing.T) {
	root := repoRoot(t)
	cmd := exec.Command("go", "list", "-f", `{{.Dir}} {{.Name}}`, "github.com/exactlyonce/dedupe/examples/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	programs := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, name, _ := strings.Cut(line, " ")
		rel, err := filepath.Rel(filepath.Join(root, "examples"), dir)
		if err != nil {
			t.Fatal(err)
		}
		if name != "main" {
			if strings.Contains(rel, string(filepath.Separator)) {
				continue // a program's own package (quickstart/demo): its README covers it
			}
			doc, err := os.ReadFile(filepath.Join(dir, "doc.go"))
			if err != nil || !strings.Contains(string(doc), "not an example") {
				t.Errorf("examples/%s is a library: its doc.go must say it is not an example (%v)", rel, err)
			}
			continue
		}
		programs++
		readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
		if err != nil {
			t.Errorf("examples/%s has no README: %v", rel, err)
			continue
		}
		text := string(readme)
		for _, h := range []string{"\n## Its tables\n", "\n## When something is missing\n"} {
			if !strings.Contains(text, h) {
				t.Errorf("examples/%s/README.md has no section %q", rel, strings.TrimSpace(h))
			}
		}
		_, tables, _ := strings.Cut(text, "\n## Its tables\n")
		tables, _, _ = strings.Cut(tables, "\n## ")
		demo := strings.Contains(tables, "schema of its own, `dedupe_") && strings.Contains(tables, "`-keep-schema`")
		service := strings.Contains(tables, "never drops them") && strings.Contains(tables, "?search_path=") &&
			strings.Contains(tables, "DROP SCHEMA") && strings.Contains(tables, "DROP TABLE")
		if demo == service {
			t.Errorf("examples/%s/README.md, Its tables: say either a schema of its own dropped unless -keep-schema (a demo) or the tables it never drops, with ?search_path= and the DROP statements (a service):\n%s", rel, tables)
		}
	}
	if programs < 10 {
		t.Fatalf("found %d example programs", programs)
	}
}
