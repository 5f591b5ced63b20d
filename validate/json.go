package validate

// JSON checks that body is one JSON value (RFC 8259, in UTF-8, nested at most MaxDepth
// levels) in which no object holds two members of the same name, at any depth: for bodies
// decoded by encoding/json, which keeps the last of two members and would act on what a
// reader of the first does not see. A duplicate is reported with Duplicate set.
func JSON(body []byte) error {
	if len(body) > maxBody {
		return &Error{Reason: "is larger than the 2 GiB the validators read"}
	}
	s := scanner{data: body}
	if err := s.skipValue(0); err != nil {
		return err
	}
	if err := s.end(); err != nil {
		return err
	}
	return nil
}
