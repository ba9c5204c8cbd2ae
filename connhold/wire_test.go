package connhold

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestPostEventWire(t *testing.T) {
	var got *http.Request
	var body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		w.Header().Set(SetTagsHeader, "room:1, user:7")
		w.Header().Set(SetMetaHeader, base64.RawURLEncoding.EncodeToString([]byte(`{"u":7}`)))
		w.Header().Set("Content-Type", EventsContentType)
		w.Write(AppendEvent(AppendEvent(nil, Message{Payload: []byte("one")}), Message{Binary: true, Payload: []byte{0, 1}}))
	}))
	defer srv.Close()
	ev := Event{ConnID: NewID(), Seq: 7, Kind: KindText, Payload: []byte("hello"), Redelivery: true, Tags: []string{"a", "b"}, Meta: []byte("m")}
	r, err := PostEvent(context.Background(), srv.Client(), srv.URL, ev)
	if err != nil {
		t.Fatal(err)
	}
	h := got.Header
	if got.Method != http.MethodPost || got.URL.Path != EventPath || h.Get(ConnIDHeader) != ev.ConnID || h.Get(SeqHeader) != "7" ||
		h.Get(EventHeader) != "text" || h.Get(RedeliveryHeader) != "1" || h.Get(TagsHeader) != "a,b" ||
		h.Get(MetaHeader) != base64.RawURLEncoding.EncodeToString([]byte("m")) || body != "hello" {
		t.Errorf("request %s %s %v body %q", got.Method, got.URL.Path, h, body)
	}
	if len(r.Messages) != 2 || string(r.Messages[0].Payload) != "one" || !r.Messages[1].Binary || *r.SetMeta == nil ||
		string(*r.SetMeta) != `{"u":7}` || len(*r.SetTags) != 2 || (*r.SetTags)[1] != "user:7" {
		t.Errorf("reply %+v", r)
	}
}

func TestPostEventNot2xxIsNotAcknowledged(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }))
	defer srv.Close()
	if _, err := PostEvent(context.Background(), srv.Client(), srv.URL, Event{Kind: KindText}); err == nil {
		t.Error("a 503 acknowledged the event")
	}
}

func TestParseReply(t *testing.T) {
	cases := []struct {
		name    string
		h       http.Header
		body    string
		wantErr bool
		check   func(Reply) bool
	}{
		{"empty", http.Header{}, "", false, func(r Reply) bool { return len(r.Messages) == 0 && r.SetTags == nil && r.SetMeta == nil }},
		{"text body", http.Header{}, "hi", false, func(r Reply) bool { return len(r.Messages) == 1 && !r.Messages[0].Binary }},
		{"binary body", http.Header{"Content-Type": {"application/octet-stream"}}, "\xff", false, func(r Reply) bool { return r.Messages[0].Binary }},
		{"text not utf-8", http.Header{}, "\xff", true, nil},
		{"clear tags", http.Header{SetTagsHeader: {""}}, "", false, func(r Reply) bool { return r.SetTags != nil && len(*r.SetTags) == 0 }},
		{"too many tags", http.Header{SetTagsHeader: {"1,2,3,4,5,6,7,8,9,10,11"}}, "", true, nil},
		{"meta too big", http.Header{SetMetaHeader: {base64.RawURLEncoding.EncodeToString(make([]byte, MaxMeta+1))}}, "", true, nil},
		{"close", http.Header{CloseHeader: {"4000"}, CloseReasonHeader: {"bye"}}, "", false, func(r Reply) bool { return r.CloseCode == 4000 && r.CloseReason == "bye" }},
		{"close code reserved", http.Header{CloseHeader: {"1006"}}, "", true, nil},
		{"events with close", http.Header{"Content-Type": {EventsContentType}}, "TEXT 2\r\nhi\r\nCLOSE 5\r\n\x0f\xa0bye\r\n", false,
			func(r Reply) bool { return len(r.Messages) == 1 && r.CloseCode == 4000 && r.CloseReason == "bye" }},
		{"events bad length", http.Header{"Content-Type": {EventsContentType}}, "TEXT 9\r\nhi\r\n", true, nil},
		{"events unknown", http.Header{"Content-Type": {EventsContentType}}, "NOPE\r\n", true, nil},
		{"auto-response", http.Header{AutoRequestHeader: {"ping"}, AutoResponseHeader: {"pong"}}, "", false, func(r Reply) bool { return r.AutoRequest == "ping" && r.AutoResponse == "pong" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseReply(tc.h, []byte(tc.body))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v", err)
			}
			if err == nil && !tc.check(r) {
				t.Errorf("reply %+v", r)
			}
		})
	}
}

// TestParseEventsAnyLength: an event is read whole whatever its length and wherever it
// falls in the body; the box once compared the length with what one 4 KiB read had
// buffered, and refused every event longer than what was left of it.
func TestParseEventsAnyLength(t *testing.T) {
	for _, n := range []int{0, 1, 4096 - 10, 4096 - 9, 4096, 4097, 5000, 256 << 10, 256<<10 + 1, 1 << 20, 1<<20 + 1} {
		for _, lead := range []int{0, 2000, 4090} {
			t.Run(fmt.Sprintf("%d after %d", n, lead), func(t *testing.T) {
				first := Message{Payload: bytes.Repeat([]byte("a"), lead)}
				bin := Message{Binary: true, Payload: patterned(n)}
				text := Message{Payload: bytes.Repeat([]byte("é"), n/2)}
				body := AppendEvent(AppendEvent(AppendEvent(nil, first), bin), text)
				body = AppendClose(body, 4001, "done")
				msgs, code, reason, err := ParseEvents(body)
				if err != nil {
					t.Fatal(err)
				}
				if len(msgs) != 3 || !bytes.Equal(msgs[0].Payload, first.Payload) || !msgs[1].Binary ||
					!bytes.Equal(msgs[1].Payload, bin.Payload) || msgs[2].Binary || !bytes.Equal(msgs[2].Payload, text.Payload) {
					t.Errorf("%d messages, not the three sent", len(msgs))
				}
				if code != 4001 || reason != "done" {
					t.Errorf("close %d %q", code, reason)
				}
			})
		}
	}
	// One byte short of what the length says is refused, not read past the body.
	body := AppendEvent(nil, Message{Payload: patterned(5000)})
	if _, _, _, err := ParseEvents(body[:len(body)-3]); err == nil {
		t.Error("an event cut short was accepted")
	}
}

// patterned is n bytes that differ along their length, so a payload shifted or cut shows.
func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// FuzzParseEvents: ParseEvents never panics, never makes up bytes, reads any bytes back
// from one BINARY event, and what it parses re-encodes (AppendEvent, AppendClose) to a
// body that parses to the same events. The seed corpus (testdata/fuzz/FuzzParseEvents)
// holds bodies whose events span 4 KiB reads.
func FuzzParseEvents(f *testing.F) {
	f.Add([]byte("TEXT 2\r\nhi\r\n"))
	f.Add([]byte("BINARY 3\r\n\x00\x01\x02\r\nCLOSE 2\r\n\x03\xe8\r\n"))
	f.Add([]byte("OPEN\r\nTEXT 0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Any bytes, as one BINARY event, come back whole (the seeds are over 4 KiB).
		wrapped, _, _, err := ParseEvents(AppendEvent(nil, Message{Binary: true, Payload: b}))
		if err != nil || len(wrapped) != 1 || !bytes.Equal(wrapped[0].Payload, b) {
			t.Fatalf("%d bytes as one BINARY event: %d messages, %v", len(b), len(wrapped), err)
		}
		msgs, code, reason, err := ParseEvents(b)
		if err != nil {
			return
		}
		var total int
		for _, m := range msgs {
			total += len(m.Payload)
		}
		if total > len(b) || (code != 0 && !sendableCode(code)) {
			t.Fatalf("%d bytes of messages from %d, code %d", total, len(b), code)
		}
		var again []byte
		for _, m := range msgs {
			again = AppendEvent(again, m)
		}
		if code != 0 {
			again = AppendClose(again, code, reason)
		}
		msgs2, code2, reason2, err := ParseEvents(again)
		if err != nil {
			t.Fatalf("re-encoded events do not parse: %v", err)
		}
		if code2 != code || reason2 != reason || len(msgs2) != len(msgs) {
			t.Fatalf("re-encoded: %d messages close %d %q, want %d close %d %q", len(msgs2), code2, reason2, len(msgs), code, reason)
		}
		for i := range msgs {
			if msgs2[i].Binary != msgs[i].Binary || !bytes.Equal(msgs2[i].Payload, msgs[i].Payload) {
				t.Fatalf("message %d changed in re-encoding", i)
			}
		}
	})
}

func TestReserved(t *testing.T) {
	for p, want := range map[string]bool{
		"/.lchat/ws/event": true, "/.lchat": true, "/x/../.lchat/ws/send": true, "//.lchat/ws": true,
		"/": false, "/.lchatx": false, "/api/.lchat/ws": false, "/ws": false,
	} {
		if got := Reserved(p); got != want {
			t.Errorf("Reserved(%q) = %v", p, got)
		}
	}
}
