package docs

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docCommand is one command a user page prints: a line (continuations joined) of a ```sh
// block, or an inline code span that starts with `gateway ` or `bin/gateway `.
type docCommand struct {
	file   string // relative to the repository's root
	line   int
	text   string
	inline bool
	block  int // the page's ```sh block it is in, from 0; -1 for an inline one
}

// key names the command in the tables of TestDocumentedCommands: "FILE: COMMAND".
func (c docCommand) key() string { return c.file + ": " + c.text }

// userPages are the pages whose commands TestDocumentedCommands runs: the README and docs/.
func userPages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, f := range markdownFiles(t) {
		rel, _ := filepath.Rel(root, f)
		rel = filepath.ToSlash(rel)
		if rel == "README.md" || strings.HasPrefix(rel, "docs/") {
			out = append(out, rel)
		}
	}
	return out
}

// pageCommands lists the commands of one page, in the page's order: those of its ```sh blocks
// first, then its inline ones.
func pageCommands(t *testing.T, file string) []docCommand {
	t.Helper()
	lines := readLines(t, filepath.Join(root, file))
	var out []docCommand
	indent, inBlock, sh := "", false, false
	pending, start, block := "", 0, -1
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			if !inBlock {
				inBlock, sh = true, trimmed == "```sh"
				indent = line[:len(line)-len(strings.TrimLeft(line, " "))]
				if sh {
					block++
				}
			} else {
				inBlock = false
			}
			continue
		}
		if !inBlock || !sh {
			continue
		}
		code := stripComment(strings.TrimPrefix(line, indent))
		if strings.TrimSpace(code) == "" && pending == "" {
			continue
		}
		if pending == "" {
			start = i + 1
		}
		// A line ending in \ or | goes on on the next one.
		if c, ok := strings.CutSuffix(strings.TrimRight(code, " "), `\`); ok {
			pending += strings.TrimSpace(c) + " "
			continue
		}
		if strings.HasSuffix(strings.TrimRight(code, " "), "|") {
			pending += strings.TrimSpace(code) + " "
			continue
		}
		out = append(out, docCommand{file: file, line: start, text: strings.TrimSpace(pending + strings.TrimSpace(code)), block: block})
		pending = ""
	}
	return append(out, inlineCommands(t, file)...)
}

// stripComment cuts a shell comment (" #" outside quotes) off a line.
func stripComment(line string) string {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || line[i-1] == ' '):
			return strings.TrimRight(line[:i], " ")
		}
	}
	return line
}

var inlineGateway = regexp.MustCompile("`((?:bin/)?gateway [^`]+)`")

// inlineCommands are the code spans of a page's prose that start with the binary's name
// (a span may run over a line break; a table cell's \| is a |).
func inlineCommands(t *testing.T, file string) []docCommand {
	t.Helper()
	prose := proseLines(t, filepath.Join(root, file))
	var nums []int
	for n := range prose {
		nums = append(nums, n)
	}
	slices.Sort(nums)
	var out []docCommand
	seen := map[string]bool{}
	for i, n := range nums {
		text := prose[n]
		if i+1 < len(nums) && nums[i+1] == n+1 {
			text += " " + prose[n+1] // a span broken over two lines
		}
		for _, m := range inlineGateway.FindAllStringSubmatchIndex(text, -1) {
			if m[0] >= len(prose[n]) {
				continue // it starts on the next line: found there
			}
			cmd := strings.ReplaceAll(text[m[2]:m[3]], `\|`, "|")
			cmd = strings.Join(strings.Fields(cmd), " ")
			if !seen[cmd] {
				seen[cmd] = true
				out = append(out, docCommand{file: file, line: n, text: cmd, inline: true, block: -1})
			}
		}
	}
	return out
}

var placeholder = regexp.MustCompile(`\b[A-Z][A-Z_]{1,}\b|[|\[<]|\.\.\.`)

// synopsis says whether an inline command is a synopsis (placeholders such as FILE, NAME,
// alternatives a|b, optional [parts]) rather than a command to run as printed.
func synopsis(text string) bool {
	return placeholder.MatchString(strings.TrimPrefix(text, "bin/"))
}

// commandWords are the words of a command before its first flag or placeholder: the
// command's path (gateway keys list).
func commandWords(text string) []string {
	var words []string
	for _, w := range strings.Fields(strings.TrimPrefix(text, "bin/")) {
		if strings.HasPrefix(w, "-") || placeholder.MatchString(w) && !strings.Contains(w, "|") {
			break
		}
		words = append(words, w)
		if strings.Contains(w, "|") {
			break
		}
	}
	return words
}

// flagsOf are the flags a command names (-config, --endpoint), without their values.
func flagsOf(text string) []string {
	var out []string
	for _, w := range strings.Fields(text) {
		w = strings.Trim(w, "[]()")
		if strings.HasPrefix(w, "-") && len(w) > 1 {
			name, _, _ := strings.Cut(w, "=")
			out = append(out, name)
		}
	}
	return out
}
