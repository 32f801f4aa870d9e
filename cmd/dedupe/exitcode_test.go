package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestExitCodesDocumented keeps the exit* constants, the help text and the
// package documentation in step: each lists the same codes.
func TestExitCodesDocumented(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "exitcode.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var consts []int
	ast.Inspect(f, func(n ast.Node) bool {
		if v, ok := n.(*ast.ValueSpec); ok && strings.HasPrefix(v.Names[0].Name, "exit") && len(v.Values) == 1 {
			if lit, ok := v.Values[0].(*ast.BasicLit); ok && lit.Kind == token.INT {
				code, _ := strconv.Atoi(lit.Value)
				consts = append(consts, code)
			}
		}
		return true
	})
	slices.Sort(consts)
	if len(consts) < 5 {
		t.Fatalf("found only the exit codes %v in exitcode.go", consts)
	}

	doc, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	_, docCodes, ok := strings.Cut(doc.Doc.Text(), "# Exit codes")
	if !ok {
		t.Fatal("doc.go has no # Exit codes section")
	}
	for name, text := range map[string]string{"help text": exitCodes, "doc.go": docCodes} {
		if got := listedCodes(text); !slices.Equal(got, consts) {
			t.Errorf("%s lists the exit codes %v, exitcode.go defines %v", name, got, consts)
		}
	}
}

// listedCodes returns the codes that start the lines of an exit-code table.
func listedCodes(text string) []int {
	var codes []int
	for _, m := range regexp.MustCompile(`(?m)^\s+(\d+)\s`).FindAllStringSubmatch(text, -1) {
		code, _ := strconv.Atoi(m[1])
		codes = append(codes, code)
	}
	slices.Sort(codes)
	return codes
}
