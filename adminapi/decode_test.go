package adminapi

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

func TestDecode(t *testing.T) {
	const secret = "s3cr3t-value"
	type body struct {
		A int    `json:"a"`
		S string `json:"s,omitempty"`
	}
	const max = 64
	for _, tc := range []struct {
		name   string
		body   io.Reader
		want   body
		status int // 0: accepted
		msg    string
	}{
		{"one object", strings.NewReader(`{"a": 1}`), body{A: 1}, 0, ""},
		{"trailing white space", strings.NewReader("{\"a\": 1}\r\n\t "), body{A: 1}, 0, ""},
		{"exactly max bytes", strings.NewReader(`{"a": 1, "s": "` + strings.Repeat("x", max-17) + `"}`), body{A: 1, S: strings.Repeat("x", max-17)}, 0, ""},
		{"malformed JSON inside a secret", strings.NewReader(`{"s": "` + secret + `\q"}`), body{}, http.StatusBadRequest,
			"decoding request body: malformed JSON at byte 21"},
		{"cut short", strings.NewReader(`{"s": "` + secret), body{}, http.StatusBadRequest, "decoding request body: unexpected EOF"},
		{"empty", strings.NewReader(""), body{}, http.StatusBadRequest, "decoding request body: EOF"},
		{"unknown field", strings.NewReader(`{"a": 1, "b": 2}`), body{}, http.StatusBadRequest, `decoding request body: json: unknown field "b"`},
		{"wrong type", strings.NewReader(`{"a": "1"}`), body{}, http.StatusBadRequest,
			"decoding request body: json: cannot unmarshal string into Go struct field body.a of type int"},
		{"two objects", strings.NewReader(`{"a": 1} {"a": 2}`), body{}, http.StatusBadRequest, "decoding request body: trailing data after the JSON object"},
		{"junk after the object", strings.NewReader(`{"a": 1} junk`), body{}, http.StatusBadRequest, "decoding request body: trailing data after the JSON object"},
		{"a closing brace after the object", strings.NewReader(`{"a": 1}}`), body{}, http.StatusBadRequest, "decoding request body: trailing data after the JSON object"},
		{"a closing bracket after the object", strings.NewReader(`{"a": 1} ]`), body{}, http.StatusBadRequest, "decoding request body: trailing data after the JSON object"},
		{"one byte over max", strings.NewReader(`{"a": 1, "s": "` + strings.Repeat("x", max-16) + `"}`), body{}, http.StatusRequestEntityTooLarge,
			"request body larger than 64 bytes"},
		{"failed read", iotest.ErrReader(errors.New("connection reset")), body{}, http.StatusBadRequest, "reading request body: connection reset"},
	} {
		var got body
		err := Decode(tc.body, max, &got)
		if tc.status == 0 {
			if err != nil || got != tc.want {
				t.Errorf("%s: got %+v, %v; want %+v", tc.name, got, err, tc.want)
			}
			continue
		}
		var be *BodyError
		if !errors.As(err, &be) || be.Status != tc.status || be.Error() != tc.msg {
			t.Errorf("%s: got %#v; want %d %q", tc.name, err, tc.status, tc.msg)
			continue
		}
		if strings.Contains(be.Message, secret) || strings.Contains(be.Message, `\q`) {
			t.Errorf("%s: %q quotes the body", tc.name, be.Message)
		}
	}
}
