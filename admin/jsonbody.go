package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/docsgate/gateway/validate"
)

// readJSONBody reads a request's JSON body of at most max bytes (a whole number of KiB) and
// decodes it into v, strictly: no unknown field, nothing after the object, and no member
// named twice at any depth. A value of the wrong type names its field; a duplicate names the
// member.
func readJSONBody(w http.ResponseWriter, r *http.Request, v any, max int64) *fieldError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return &fieldError{"body", fmt.Sprintf("larger than %d KiB", max>>10)}
	case err != nil:
		return &fieldError{"body", "could not be read"}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if fe := decodeError(dec.Decode(v)); fe != nil {
		return fe
	}
	if _, err := dec.Token(); err != io.EOF {
		return &fieldError{"body", "send one JSON object, nothing after it"}
	}
	return uniqueMembers(body)
}

// msgGivenTwice is the message of a member named twice.
const msgGivenTwice = "given twice: send each member once"

// twice tells whether fe is a member named twice.
func (fe *fieldError) twice() bool { return fe.msg == msgGivenTwice }

// uniqueMembers refuses a body in which an object names a member twice, at any depth:
// encoding/json keeps the last of the two, so a reader of the first (a log, a proxy, the
// operator's own eyes) would not see what the gateway acted on. It also refuses what the
// validators refuse of any JSON (invalid UTF-8, nesting past 64 levels).
func uniqueMembers(body []byte) *fieldError {
	err := validate.JSON(body)
	var ve *validate.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ve) && ve.Duplicate != "":
		return &fieldError{clipField(ve.Duplicate), msgGivenTwice}
	}
	return &fieldError{"body", strings.TrimPrefix(err.Error(), "body ")}
}
