package connhold

import (
	"net/http"
	"strings"
	"testing"
)

func TestSSEEventsPassWholeEventsAndTrackTheID(t *testing.T) {
	cases := []struct {
		name   string
		chunks []string
		out    string
		id     string
		hasID  bool
	}{
		{"one event", []string{"id: 1\ndata: a\n\n"}, "id: 1\ndata: a\n\n", "1", true},
		{"split", []string{"id: 2\nda", "ta: b\n", "\n"}, "id: 2\ndata: b\n\n", "2", true},
		{"crlf", []string{"id:3\r\ndata: c\r\n\r\n"}, "id:3\r\ndata: c\r\n\r\n", "3", true},
		{"partial kept", []string{"id: 1\ndata: a\n\nid: 2\ndata: b"}, "id: 1\ndata: a\n\n", "1", true},
		{"comment", []string{": keepalive\n\n"}, ": keepalive\n\n", "", false},
		{"id field without colon clears", []string{"id: 5\n\nid\ndata: x\n\n"}, "id: 5\n\nid\ndata: x\n\n", "", true},
		{"idx is another field", []string{"idx: 9\ndata: x\n\n"}, "idx: 9\ndata: x\n\n", "", false},
		{"null ignored", []string{"id: 7\n\nid: a\x00b\n\n"}, "id: 7\n\nid: a\x00b\n\n", "7", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s SSEEvents
			var out strings.Builder
			for _, c := range tc.chunks {
				b, err := s.Feed([]byte(c))
				if err != nil {
					t.Fatal(err)
				}
				out.Write(b)
			}
			id, has := s.LastID()
			if out.String() != tc.out || id != tc.id || has != tc.hasID {
				t.Errorf("out %q id %q %v; want %q %q %v", out.String(), id, has, tc.out, tc.id, tc.hasID)
			}
		})
	}
}

func TestSSECutDropsTheHalfEvent(t *testing.T) {
	var s SSEEvents
	s.Feed([]byte("id: 1\ndata: a\n\nid: 2\ndata: half"))
	s.Cut()
	out, _ := s.Feed([]byte("id: 2\ndata: whole\n\n"))
	if string(out) != "id: 2\ndata: whole\n\n" {
		t.Errorf("after a cut: %q", out)
	}
}

func TestSSEEventTooLarge(t *testing.T) {
	var s SSEEvents
	if _, err := s.Feed([]byte("data: " + strings.Repeat("x", MaxSSEEvent))); err != ErrSSEEventTooLarge {
		t.Errorf("err %v", err)
	}
}

func TestResumable(t *testing.T) {
	h := http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}, SSEHeader: {"resumable"}}
	if !Resumable(200, h) {
		t.Error("a marked stream is not resumable")
	}
	if Resumable(200, http.Header{"Content-Type": {"text/event-stream"}}) || Resumable(204, h) {
		t.Error("an unmarked stream or a 204 is resumable")
	}
}

func FuzzSSEEvents(f *testing.F) {
	f.Add([]byte("id: 1\ndata: a\n\n"), 3)
	f.Add([]byte("id:3\r\ndata: c\r\n\r\n: c\n\n"), 5)
	f.Fuzz(func(t *testing.T, b []byte, split int) {
		var s SSEEvents
		if split < 0 || split > len(b) {
			split = len(b) / 2
		}
		o1, err1 := s.Feed(b[:split])
		o2, err2 := s.Feed(b[split:])
		if err1 != nil || err2 != nil {
			return
		}
		got := string(o1) + string(o2) + string(s.partial)
		if got != string(b) {
			t.Fatalf("bytes lost or changed: %q -> %q", b, got)
		}
	})
}
