package held

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"reflect"
	"testing"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/connhold"
)

// TestReadForwardedAnswer: a peer's answer to a forwarded event is a replay to do first
// (409 naming the stale instances), an event not acknowledged (any other non-2xx; not
// delivered at all when the peer's box refused it, so the next try is no redelivery), or
// the instance's reply stamped with the instance, the mark and what a checkpoint there
// covers. A 2xx the peer did not stamp, or whose body is over connhold.MaxAnswer, is not
// an acknowledgement the entry box may count on.
func TestReadForwardedAnswer(t *testing.T) {
	at := connhold.At{Box: boxtest.SelfB, Incarnation: "inc-1", Instance: "i-7"}
	earlier := connhold.At{Box: boxtest.SelfA, Incarnation: "inc-0", Instance: "i-3"}
	stamp := func(h http.Header, mark, covered string) http.Header {
		h.Set(connhold.AckAtHeader, at.String())
		if mark != "" {
			h.Set(connhold.AckMarkHeader, mark)
		}
		if covered != "" {
			h.Set(connhold.CoveredHeader, covered)
		}
		return h
	}
	tags := []string{"a", "b"}
	big := bytes.Repeat([]byte{0xff}, connhold.MaxAnswer)
	for _, tc := range []struct {
		name   string
		status int
		header http.Header
		body   []byte
		replay []connhold.At   // a *connhold.ReplayError naming these
		is     []error         // errors.Is holds for each
		isNot  []error         // and for none of these
		reply  *connhold.Reply // nil: an error
	}{
		{name: "replay", status: 409,
			header: http.Header{connhold.ReplayHeader: {at.String(), earlier.String()}},
			replay: []connhold.At{at, earlier}},
		{name: "replay naming a malformed instance", status: 409,
			header: http.Header{connhold.ReplayHeader: {"box-b"}}, isNot: []error{connhold.ErrNotDelivered}},
		{name: "409 without a replay", status: 409, header: http.Header{},
			is: []error{connhold.ErrNotAcknowledged}, isNot: []error{connhold.ErrNotDelivered}},
		{name: "instance's 500", status: 500, header: http.Header{}, body: []byte("oops"),
			is: []error{connhold.ErrNotAcknowledged}, isNot: []error{connhold.ErrNotDelivered}},
		{name: "refused by the peer's box", status: 503, header: http.Header{connhold.RefusedHeader: {"1"}},
			is: []error{connhold.ErrNotAcknowledged, connhold.ErrNotDelivered}},
		{name: "refused 404", status: 404, header: http.Header{connhold.RefusedHeader: {"1"}},
			is: []error{connhold.ErrNotAcknowledged, connhold.ErrNotDelivered}},
		{name: "redirect", status: 302, header: stamp(http.Header{}, "5", "3"),
			is: []error{connhold.ErrNotAcknowledged}},
		{name: "2xx without a mark", status: 200, header: stamp(http.Header{}, "", "3"), body: []byte("hi")},
		{name: "2xx with mark 0", status: 200, header: stamp(http.Header{}, "0", "")},
		{name: "2xx without the instance", status: 200, header: http.Header{connhold.AckMarkHeader: {"5"}}},
		{name: "2xx over MaxAnswer", status: 200, header: stamp(http.Header{}, "5", "3"), body: append(big, 'x'),
			is: []error{connhold.ErrNotAcknowledged}},
		{name: "2xx with a reply that is no reply", status: 200, header: stamp(http.Header{}, "5", "3"),
			body: []byte{0xff}},
		{name: "acknowledged with a message and tags", status: 200,
			header: stamp(http.Header{connhold.SetTagsHeader: {"a,b"}}, "5", "3"), body: []byte("hello"),
			reply: &connhold.Reply{Messages: []connhold.Message{{Payload: []byte("hello")}}, SetTags: &tags,
				At: at, Mark: 5, Covered: 3}},
		{name: "acknowledged, nothing covered yet", status: 204, header: stamp(http.Header{}, "9", ""),
			reply: &connhold.Reply{At: at, Mark: 9}},
		{name: "acknowledged with a MaxAnswer message", status: 200,
			header: stamp(http.Header{"Content-Type": {"application/octet-stream"}}, "5", "5"), body: big,
			reply: &connhold.Reply{Messages: []connhold.Message{{Binary: true, Payload: big}}, At: at, Mark: 5, Covered: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: tc.status, Header: tc.header, Body: io.NopCloser(bytes.NewReader(tc.body))}
			reply, err := readForwardedAnswer(resp)
			if tc.reply != nil {
				if err != nil {
					t.Fatalf("not acknowledged: %v", err)
				}
				if !reflect.DeepEqual(reply, *tc.reply) {
					t.Fatalf("reply %+v, want %+v", reply, *tc.reply)
				}
				return
			}
			if err == nil {
				t.Fatalf("acknowledged: %+v", reply)
			}
			if !reflect.DeepEqual(reply, connhold.Reply{}) {
				t.Errorf("a failed answer came with a reply: %+v", reply)
			}
			re, replay := connhold.IsReplay(err)
			if (tc.replay != nil) != replay {
				t.Fatalf("%v: a replay %v, want %v", err, replay, tc.replay != nil)
			}
			if replay && !reflect.DeepEqual(re.Stale, tc.replay) {
				t.Errorf("replay of %v, want %v", re.Stale, tc.replay)
			}
			for _, e := range tc.is {
				if !errors.Is(err, e) {
					t.Errorf("%v is not %v", err, e)
				}
			}
			for _, e := range tc.isNot {
				if errors.Is(err, e) {
					t.Errorf("%v is %v", err, e)
				}
			}
		})
	}
}
