package adminapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// BodyError is a request body Decode refused: the HTTP status to answer with and a
// message that says why without quoting the body (it may hold a secret, an env value
// or a token).
type BodyError struct {
	// Status is http.StatusBadRequest, or http.StatusRequestEntityTooLarge for a body
	// over the limit.
	Status  int
	Message string
}

func (e *BodyError) Error() string { return e.Message }

// Decode reads body, at most max bytes of it, as exactly one JSON value into v,
// refusing fields v does not have and anything after the value. It returns nil or a
// *BodyError; the admin glue answers with its Status and Message.
func Decode(body io.Reader, max int64, v any) error {
	raw, err := io.ReadAll(io.LimitReader(body, max+1))
	if err != nil {
		return &BodyError{http.StatusBadRequest, fmt.Sprintf("reading request body: %v", err)}
	}
	if int64(len(raw)) > max {
		// Said as such: a truncated body would only read as "unexpected EOF".
		return &BodyError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", max)}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			// Its message quotes a character of the body.
			return &BodyError{http.StatusBadRequest, fmt.Sprintf("decoding request body: malformed JSON at byte %d", syn.Offset)}
		}
		return &BodyError{http.StatusBadRequest, fmt.Sprintf("decoding request body: %v", err)}
	}
	// Not dec.More(): it is false before a stray "}" or "]".
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		// Two objects, or an object and junk: which one was meant is a guess.
		return &BodyError{http.StatusBadRequest, "decoding request body: trailing data after the JSON object"}
	}
	return nil
}
