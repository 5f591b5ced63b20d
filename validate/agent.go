package validate

// AgentJob validates the body of POST /v2/agent/{projectId}/job:
//
//	{"prompt": "<non-empty string>", ...any other fields}
//
// It returns a *Error for the first problem found, or nil when the body is
// valid. The body is not modified.
func AgentJob(body []byte) error {
	s := scanner{data: body}
	if err := s.agentJob(); err != nil {
		return err
	}
	return nil // not a nil *Error: that would be a non-nil error interface
}

func (s *scanner) agentJob() *Error {
	if err := s.begin(); err != nil {
		return err
	}
	seenPrompt := false
	for first := true; ; first = false {
		key, escaped, more, err := s.nextMember(first)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		var buf [keyBufLen]byte
		k := unescape(key, escaped, &buf)
		switch string(k) {
		case "prompt":
			// A second "prompt" is refused: the gateway and the upstream
			// might otherwise disagree on which one counts.
			if seenPrompt {
				return fieldError("prompt", reasonDuplicated)
			}
			seenPrompt = true
			if s.peek() != '"' {
				return s.mismatch("prompt", reasonNonEmptyString, 1)
			}
			raw, _, err := s.str()
			if err != nil {
				return err
			}
			// Every escape unescapes to at least one character, so the raw
			// length is zero exactly when the string is empty.
			if len(raw) == 0 {
				return fieldError("prompt", reasonNonEmptyString)
			}
		default:
			if known := foldedName(k, agentNames[:]); known != "" {
				return foldedError(known, k)
			}
			if err := s.member(key, escaped); err != nil {
				return err
			}
			if err := s.skipIn("", 1); err != nil {
				return err
			}
		}
	}
	if err := s.closeObject(); err != nil {
		return err
	}
	// Trailing garbage makes the body not JSON at all, which is the more
	// fundamental complaint, so it is checked before required fields.
	if err := s.end(); err != nil {
		return err
	}
	if !seenPrompt {
		return fieldError("prompt", reasonRequired)
	}
	return nil
}
