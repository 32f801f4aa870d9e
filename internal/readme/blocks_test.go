package readme

import (
	"bufio"
	"strings"
)

// block is one fenced code block of a Markdown file.
type block struct {
	lang string // the info string: "sh", "go", or "" for plain output
	line int    // the line of the opening fence
	text string // the content, each line ending in a newline
}

// fencedBlocks returns the fenced code blocks (``` at the start of a line)
// of markdown, in order.
func fencedBlocks(markdown string) []block {
	var (
		blocks []block
		cur    *block
		body   strings.Builder
	)
	sc := bufio.NewScanner(strings.NewReader(markdown))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &block{lang: strings.TrimSpace(strings.TrimPrefix(line, "```")), line: n}
			body.Reset()
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.text = body.String()
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	return blocks
}
