package dedupe_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// modulePath is the import path of the repository's root package.
const modulePath = "github.com/exactlyonce/dedupe"

// listedPackage is what go list says of one package of the repository:
// its path relative to the repository root ("." for the root) and those of
// the repository's packages it imports, directly or not (test files
// excluded).
type listedPackage struct {
	Rel  string
	Deps []string
}

// TestArchitectureListsEveryPackage: ARCHITECTURE.md's tables name exactly
// the packages go list finds in the workspace, and its import rules hold.
func TestArchitectureListsEveryPackage(t *testing.T) {
	t.Parallel()
	md, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := documentedPackages(md)
	pkgs := goListPackages(t)
	listed := make([]string, 0, len(pkgs))
	for _, p := range pkgs {
		listed = append(listed, p.Rel)
	}
	for _, p := range listed {
		if !slices.Contains(documented, p) {
			t.Errorf("package %s is not in ARCHITECTURE.md: add a row \"| `%s` | what it holds |\" to the table of its group", p, p)
		}
	}
	for _, p := range documented {
		if !slices.Contains(listed, p) {
			t.Errorf("ARCHITECTURE.md names %s, which go list does not find: delete its row (or add its module to go.work)", p)
		}
	}
	for _, v := range importViolations(pkgs) {
		t.Error(v)
	}
}

// TestImportRulesCatchViolations: the import rules refuse each arrow that
// ARCHITECTURE.md forbids, so TestArchitectureListsEveryPackage can fail.
func TestImportRulesCatchViolations(t *testing.T) {
	t.Parallel()
	bad := []listedPackage{
		{Rel: ".", Deps: []string{"internal/uuid", "outbox"}},
		{Rel: "outbox", Deps: []string{".", "adapters/nats"}},
		{Rel: "adapters/kafka", Deps: []string{".", "outbox", "adapters/nats"}},
		{Rel: "internal/corelink", Deps: []string{"internal/uuid"}},
	}
	if got := importViolations(bad); len(got) != 4 {
		t.Fatalf("violations = %q, want one per package", got)
	}
	good := []listedPackage{
		{Rel: ".", Deps: []string{"internal/uuid", "internal/corelink"}},
		{Rel: "outbox", Deps: []string{".", "internal/corelink"}},
		{Rel: "adapters/kafka", Deps: []string{".", "outbox", "internal/uuid"}},
		{Rel: "adapters/kafka/test", Deps: []string{".", "adapters/kafka", "adapters/nats"}},
		{Rel: "internal/corelink"},
	}
	if got := importViolations(good); len(got) != 0 {
		t.Fatalf("violations = %q, want none", got)
	}
}

// importViolations checks ARCHITECTURE.md's rules ("What may import what").
func importViolations(pkgs []listedPackage) []string {
	internal := func(d string) bool { return strings.HasPrefix(d, "internal/") }
	var out []string
	for _, p := range pkgs {
		var allowed func(dep string) bool
		switch {
		case p.Rel == ".":
			allowed = internal
		case p.Rel == "outbox":
			allowed = func(d string) bool { return d == "." || internal(d) }
		case p.Rel == "internal/corelink":
			allowed = func(d string) bool { return d == "internal/driver" }
		case strings.HasPrefix(p.Rel, "adapters/") && strings.Count(p.Rel, "/") == 1:
			allowed = func(d string) bool { return d == "." || d == "outbox" || internal(d) }
		default:
			continue
		}
		for _, d := range p.Deps {
			if !allowed(d) {
				out = append(out, p.Rel+" imports "+d+", which ARCHITECTURE.md's rules forbid")
			}
		}
	}
	return out
}

// documentedPackages returns the packages named in the first cell of the
// tables of ARCHITECTURE.md's "Packages" section.
func documentedPackages(md []byte) []string {
	var out []string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Packages"
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cell, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
		out = append(out, cell)
	}
	return out
}

// goListPackages lists every package of the workspace under modulePath,
// with the workspace of the repository whatever GOWORK says.
func goListPackages(t *testing.T) []listedPackage {
	t.Helper()
	work, err := filepath.Abs("go.work")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Deps", modulePath+"/...")
	cmd.Env = append(os.Environ(), "GOWORK="+work)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	rel := func(p string) (string, bool) {
		if p == modulePath {
			return ".", true
		}
		r, ok := strings.CutPrefix(p, modulePath+"/")
		return r, ok
	}
	var out []listedPackage
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		var p struct {
			ImportPath string
			Deps       []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list: %v", err)
		}
		r, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		lp := listedPackage{Rel: r}
		for _, d := range p.Deps {
			if dr, ok := rel(d); ok {
				lp.Deps = append(lp.Deps, dr)
			}
		}
		out = append(out, lp)
	}
	if len(out) == 0 {
		t.Fatalf("go list found no package under %s", modulePath)
	}
	return out
}
