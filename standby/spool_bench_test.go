package standby

import (
	"testing"
)

// BenchmarkSpoolPut is what a standby's put of one segment costs, its sync included: the
// wait a standby kind's acknowledgement pays on the standby's disk.
//
//	go test ./standby -run '^$' -bench SpoolPut -benchtime 500x -count 3
func BenchmarkSpoolPut(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ents := make([]Entry, 0, 1024)
	seq := int64(1)
	next := func() Entry {
		if len(ents) == 0 {
			for i := range cap(ents) {
				ents = append(ents, entry(b, 1, seq+int64(i), claimA, 0))
			}
		}
		e := ents[0]
		ents = ents[1:]
		seq++
		return e
	}
	for b.Loop() {
		b.StopTimer()
		e := next()
		b.StartTimer()
		if err := s.Put(host, e); err != nil {
			b.Fatal(err)
		}
	}
}
