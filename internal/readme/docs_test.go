//go:build unix

package readme

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// maxFrontPage is how long README.md may grow: it is the front page, and the
// long-form text lives in docs/*.md.
const maxFrontPage = 350

// testCommand is the README's test command, which .ci/run runs.
const testCommand = "go test -race -count=1 github.com/exactlyonce/dedupe/..."

// TestFrontPage: README.md stays a front page of at most maxFrontPage lines
// that links every file of docs/, shows the test command, and that command
// is the one .ci/run runs.
func TestFrontPage(t *testing.T) {
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > maxFrontPage {
		t.Errorf("README.md has %d lines, more than %d: move long-form text into docs/*.md", n, maxFrontPage)
	}
	links := map[string]bool{}
	for _, l := range markdownLinks(string(readme)) {
		path, _, _ := strings.Cut(l.target, "#")
		links[path] = true
	}
	for _, doc := range docFiles(t, root) {
		if !strings.HasPrefix(doc, "docs/") {
			continue
		}
		if !links[doc] {
			t.Errorf("README.md does not link %s (its table of contents must name every file of docs/)", doc)
		}
	}
	if !strings.Contains(string(readme), "\n"+testCommand+" ") {
		t.Errorf("README.md no longer shows the test command %q", testCommand)
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), "\n"+testCommand+"\n") {
		t.Errorf(".ci/run does not run the README's test command %q", testCommand)
	}
}

// TestDocLinks: every relative link of README.md, docs/*.md and the
// examples' READMEs names a file of the repository and, for a Markdown
// file, one of its headings.
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	anchors := map[string]map[string]bool{} // file → its headings' anchors
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		anchors[file] = headingAnchors(string(text))
		return anchors[file]
	}
	for _, doc := range append(docFiles(t, root), globRel(t, root, "examples/*/README.md")...) {
		from := filepath.Join(root, doc)
		text, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range markdownLinks(string(text)) {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(l.target, "#")
			target := from
			if path != "" {
				target = filepath.Join(filepath.Dir(from), filepath.FromSlash(path))
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s:%d: link to %s: no such file", doc, l.line, l.target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !anchorsOf(target)[anchor] {
				t.Errorf("%s:%d: link to %s: no heading of %s has the anchor #%s", doc, l.line, l.target, filepath.Base(target), anchor)
			}
		}
	}
}

type link struct {
	line   int
	target string
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// markdownLinks returns the targets of the inline links of markdown, outside
// fenced code blocks.
func markdownLinks(markdown string) []link {
	var links []link
	fenced := false
	for i, line := range strings.Split(markdown, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			links = append(links, link{line: i + 1, target: m[1]})
		}
	}
	return links
}

// headingAnchors returns the anchors GitHub gives the headings of markdown:
// lower case, punctuation dropped, spaces as hyphens, a repeated one
// suffixed -1, -2, ….
func headingAnchors(markdown string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(markdown, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}
