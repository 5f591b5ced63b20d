package config

import "strings"

// Suggest is " (did you mean NAME?)" for the candidate closest to name, or "" when none is
// close enough to be a typo of it: at most one edit in four characters, and never more than
// three (agent_jobs_per_project is one edit from agent_job_per_project; assistant_per_org is
// not a typo of agent_job_per_project). A name among the candidates is no typo: "". Ties go
// to the first candidate.
func Suggest(name string, candidates []string) string {
	best, bestDist := "", 0
	for _, c := range candidates {
		if c == name {
			return ""
		}
		d := editDistance(strings.ToLower(name), strings.ToLower(c))
		if best == "" || d < bestDist {
			best, bestDist = c, d
		}
	}
	if best == "" || bestDist > min(3, max(1, len(name)/4)) {
		return ""
	}
	return " (did you mean " + best + "?)"
}

// editDistance is the Levenshtein distance of a and b, counting a swap of two neighbouring
// characters as one edit (the optimal string alignment distance): "jbo" is one typo of "job".
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// Three rows of the table are enough: the one before the previous is for swaps.
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
