package mesh

import (
	"context"
	"errors"
	"reflect"
	"testing"
)

// refusingPeer refuses the hosts in bad and records what it was sent.
type refusingPeer struct {
	bad  map[string]bool
	sent []string
}

func (p *refusingPeer) PutRoute(_ context.Context, _ string, row RouteRow) error {
	p.sent = append(p.sent, "put "+row.Host)
	if p.bad[row.Host] {
		return errors.New("refused")
	}
	return nil
}

func (p *refusingPeer) DeleteRoute(_ context.Context, _, host, rev string) error {
	p.sent = append(p.sent, "delete "+host+" "+rev)
	if p.bad[host] {
		return errors.New("refused")
	}
	return nil
}

func TestRunSeed(t *testing.T) {
	puts := []RouteRow{{Host: "a.example.com"}, {Host: "b.example.com"}}
	tombs := []Tombstone{{Host: "c.example.com", Rev: "r1"}}
	for _, tc := range []struct {
		name      string
		bad       map[string]bool
		wantFails int
		wantKinds []string
	}{
		{name: "all sent", wantKinds: []string{"plan", "put", "put", "tombstone", "done"}},
		{name: "a failure is counted and passed over", bad: map[string]bool{"a.example.com": true, "c.example.com": true},
			wantFails: 2, wantKinds: []string{"plan", "error", "put", "error", "done"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &refusingPeer{bad: tc.bad}
			var evs []SeedEvent
			fails := RunSeed(context.Background(), p, "https://peer.example.net", puts, tombs, 7, func(ev SeedEvent) { evs = append(evs, ev) })
			if fails != tc.wantFails {
				t.Fatalf("fails = %d, want %d", fails, tc.wantFails)
			}
			var kinds []string
			for _, ev := range evs {
				kinds = append(kinds, ev.Event)
			}
			if !reflect.DeepEqual(kinds, tc.wantKinds) {
				t.Fatalf("events = %v, want %v", kinds, tc.wantKinds)
			}
			if want := []string{"put a.example.com", "put b.example.com", "delete c.example.com r1"}; !reflect.DeepEqual(p.sent, want) {
				t.Fatalf("sent %v, want %v (puts before tombstones, in plan order)", p.sent, want)
			}
			first, last := evs[0], evs[len(evs)-1]
			if first.Puts != 2 || first.Tombs != 1 || first.Of != 7 {
				t.Fatalf("plan event %+v", first)
			}
			if last.Fails != tc.wantFails || last.Puts != 2 || last.Tombs != 1 {
				t.Fatalf("done event %+v", last)
			}
			if evs[2].N != 2 || evs[2].Of != 2 || evs[3].N != 1 || evs[3].Of != 1 {
				t.Fatalf("progress counts %+v %+v", evs[2], evs[3])
			}
		})
	}
}
