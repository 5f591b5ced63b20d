package validate

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// corpusBodies reads every committed fuzz corpus entry (format
// "go test fuzz v1\n[]byte(\"...\")\n").
func corpusBodies(t *testing.T) [][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		header, rest, ok := strings.Cut(string(data), "\n")
		if !ok || header != "go test fuzz v1" {
			t.Fatalf("%s: not a fuzz corpus file", name)
		}
		lit := strings.TrimSpace(rest)
		lit, ok1 := strings.CutPrefix(lit, "[]byte(")
		lit, ok2 := strings.CutSuffix(lit, ")")
		body, err := strconv.Unquote(lit)
		if !ok1 || !ok2 || err != nil {
			t.Fatalf("%s: cannot parse corpus entry: %v", name, err)
		}
		out = append(out, []byte(body))
	}
	if len(files) < 4 {
		t.Fatalf("only %d corpus files found under testdata/fuzz", len(files))
	}
	return out
}

// mutate derives bodies that sit near the boundary between valid and
// invalid: every truncation, and random deletions, duplications and
// replacements with bytes that matter to the grammar.
func mutate(rng *rand.Rand, body []byte, n int) [][]byte {
	const interesting = "{}[]:,\"\\ \t\n0-1eE.+tfnu\x00\x1f\x7f\x80\xc3\xa9\xed\xa0\xff"
	var out [][]byte
	for i := 0; i <= len(body) && i < 512; i++ {
		out = append(out, body[:i])
	}
	for range n {
		b := []byte(string(body))
		for range 1 + rng.IntN(3) {
			if len(b) == 0 {
				break
			}
			i := rng.IntN(len(b))
			switch rng.IntN(4) {
			case 0:
				b = append(b[:i], b[i+1:]...)
			case 1:
				b[i] = interesting[rng.IntN(len(interesting))]
			case 2:
				b = append(b[:i], append([]byte{interesting[rng.IntN(len(interesting))]}, b[i:]...)...)
			case 3:
				j := i + rng.IntN(len(b)-i)
				b = append(b[:j], append([]byte(string(b[i:j])), b[j:]...)...)
			}
		}
		out = append(out, b)
	}
	return out
}

func TestDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var bodies [][]byte
	for _, s := range seeds() {
		bodies = append(bodies, []byte(s))
	}
	bodies = append(bodies, corpusBodies(t)...)
	n := 200
	if testing.Short() {
		n = 20
	}
	var all [][]byte
	for _, b := range bodies {
		all = append(all, b)
		all = append(all, mutate(rng, b, n)...)
	}
	accepted := [2]int{}
	for _, b := range all {
		checkAgentJob(t, b)
		checkAssistantMessage(t, b)
		if AgentJob(b) == nil {
			accepted[0]++
		}
		if AssistantMessage(b) == nil {
			accepted[1]++
		}
	}
	t.Logf("%d bodies; accepted: AgentJob %d, AssistantMessage %d", len(all), accepted[0], accepted[1])
	// A differential test that only ever sees rejections proves little.
	if accepted[0] < 100 || accepted[1] < 100 {
		t.Fatalf("too few accepted bodies to be meaningful: %v", accepted)
	}
}
