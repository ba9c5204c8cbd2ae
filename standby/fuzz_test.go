package standby

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzDecodeEntries: a seal's answer from a peer decodes or is an error, never a panic or an
// allocation past the data; what decodes encodes back to the same bytes.
func FuzzDecodeEntries(f *testing.F) {
	ents := []Entry{entry(f, 1, 1, claimA, 3), entry(f, 1, 2, claimA, 4)}
	good := EncodeEntries(ents)
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add(append(bytes.Clone(good), 0))
	f.Add(EncodeEntries(nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 1, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeEntries(b)
		if err != nil {
			return
		}
		if !bytes.Equal(EncodeEntries(got), b) {
			t.Fatal("decoded entries encode to other bytes")
		}
		CheckSealed(got, 1, claimA)
	})
}

// FuzzSegmentBody: a segment request's body is stored (204) or refused with a 4xx, and a
// refused one changes nothing the spool holds.
func FuzzSegmentBody(f *testing.F) {
	s, err := Open(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	mustPut(f, s, host, entry(f, 1, 1, claimA, 0))
	good := segmentBody(entry(f, 1, 2, claimA, 0))
	f.Add(good)
	f.Add(good[:7])
	f.Add(good[:len(good)-1])
	f.Add(append(bytes.Clone(good), 1))
	for _, i := range []int{8, 12, 13, 30, len(good) / 2, len(good) - 5} {
		b := bytes.Clone(good)
		b[i] ^= 0x21
		f.Add(b)
	}
	f.Add(segmentBody(entry(f, 2, 1, claimB, 9)))
	f.Fuzz(func(t *testing.T, body []byte) {
		before := fmt.Sprint(s.Status())
		req := httptest.NewRequest(http.MethodPost, PathPrefix+host+"/segment", bytes.NewReader(body))
		w := httptest.NewRecorder()
		if err := s.ServePeer(w, req); err != nil {
			t.Fatal(err)
		}
		switch {
		case w.Code == http.StatusNoContent:
		case w.Code >= 400 && w.Code < 500 && w.Header().Get(ErrorHeader) != "":
			if after := fmt.Sprint(s.Status()); after != before {
				t.Fatalf("a refused body (%d %s) changed the spool: %s, was %s", w.Code, w.Body, after, before)
			}
		default:
			t.Fatalf("answer %d %s", w.Code, w.Body)
		}
	})
}
