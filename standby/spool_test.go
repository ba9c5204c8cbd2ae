package standby

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/spacestore"
)

const host = "s1.example.test"

// TestSealHandsOverTheStream: a takeover's seal returns every entry the holder stored, in
// order, and from then on the holder gets nothing stored (so no acknowledgement) here, not
// even by starting its stream again; a retried seal returns the same entries.
func TestSealHandsOverTheStream(t *testing.T) {
	s := openSpool(t, t.TempDir())
	want := []Entry{entry(t, 5, 1, claimA, 10), entry(t, 5, 2, claimA, 10), entry(t, 5, 3, claimA, 11)}
	mustPut(t, s, host, want...)
	got, err := s.Seal(host, 5, claimA)
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, got, want)
	wantErr(t, "Put after the seal", s.Put(host, entry(t, 5, 4, claimA, 11)), ErrSealed)
	wantErr(t, "Put of seq 1 after the seal", s.Put(host, entry(t, 5, 1, claimA, 12)), ErrSealed)
	wantErr(t, "retried Put of a stored seq after the seal", s.Put(host, want[2]), ErrSealed)
	again, err := s.Seal(host, 5, claimA)
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, again, want)
	st, _ := hostStatus(s, host)
	if !st.Sealed || st.LastSeq != 3 || st.Gen != 5 || st.Holder != claimA.Holder || st.BucketBefore != 11 {
		t.Fatalf("status = %+v", st)
	}
	if wantBytes := int64(0); true {
		for _, e := range want {
			wantBytes += int64(12 + len(e.Data))
		}
		if st.Bytes != wantBytes || int64(len(EncodeEntries(want))) != wantBytes+4 {
			t.Fatalf("status bytes = %d, want %d (the seal answer less its count)", st.Bytes, wantBytes)
		}
	}
}

// TestPutRules: each rule of a stream, as a sequence of puts and seals with their answers.
func TestPutRules(t *testing.T) {
	type step struct {
		seal  bool  // Seal(gen, claim) instead of a put
		gen   int64 // of the segment
		seq   int64
		claim spacestore.Claim
		bb    int64
		fill  byte // 0: 'x'
		want  error
	}
	put := func(gen, seq int64, c spacestore.Claim, bb int64, want error) step {
		return step{gen: gen, seq: seq, claim: c, bb: bb, want: want}
	}
	cases := []struct {
		name     string
		steps    []step
		last     int64 // the stream's last seq after the steps
		lastGen  int64
		lastHold string
	}{
		{"in order", []step{put(1, 1, claimA, 0, nil), put(1, 2, claimA, 0, nil), put(1, 3, claimA, 1, nil)}, 3, 1, claimA.Holder},
		{"a gap is refused, the missing seq then taken", []step{put(1, 1, claimA, 0, nil), put(1, 3, claimA, 0, ErrGap), put(1, 2, claimA, 0, nil), put(1, 3, claimA, 0, nil)}, 3, 1, claimA.Holder},
		{"no stream: only seq 1 starts one", []step{put(1, 2, claimA, 0, ErrGap), put(1, 1, claimA, 0, nil)}, 1, 1, claimA.Holder},
		{"an older generation is stale", []step{put(4, 1, claimA, 0, nil), put(3, 1, claimA, 0, ErrStale), put(3, 2, claimA, 0, ErrStale)}, 1, 4, claimA.Holder},
		{"a newer generation's seq 1 replaces the stream", []step{put(1, 1, claimA, 0, nil), put(1, 2, claimA, 0, nil), put(2, 1, claimA, 0, nil), put(1, 3, claimA, 0, ErrStale)}, 1, 2, claimA.Holder},
		{"a newer generation needs seq 1", []step{put(1, 1, claimA, 0, nil), put(2, 2, claimA, 0, ErrGap)}, 1, 1, claimA.Holder},
		{"another claim's seq 1 replaces; the replaced claim is stale", []step{put(1, 1, claimA, 0, nil), put(1, 1, claimB, 3, nil), put(1, 2, claimA, 0, ErrStale), put(1, 2, claimB, 3, nil)}, 2, 1, claimB.Holder},
		{"an unknown claim past seq 1 is a gap", []step{put(1, 1, claimA, 0, nil), put(1, 2, claimB, 0, ErrGap)}, 1, 1, claimA.Holder},
		{"a retry of the same bytes changes nothing", []step{put(1, 1, claimA, 0, nil), put(1, 2, claimA, 0, nil), put(1, 2, claimA, 0, nil), put(1, 1, claimA, 0, nil)}, 2, 1, claimA.Holder},
		{"other bytes at a stored seq conflict", []step{put(1, 1, claimA, 0, nil), put(1, 2, claimA, 0, nil), {gen: 1, seq: 2, claim: claimA, fill: 'y', want: ErrConflict}, {gen: 1, seq: 2, claim: claimA, bb: 1, want: ErrConflict}}, 2, 1, claimA.Holder},
		{"seq 1 with other bytes restarts the stream", []step{put(1, 1, claimA, 0, nil), put(1, 2, claimA, 4, nil), {gen: 1, seq: 1, claim: claimA, bb: 4, fill: 'y'}}, 1, 1, claimA.Holder},
		{"a delayed older seq 1 is stale", []step{put(1, 1, claimA, 2, nil), put(1, 2, claimA, 4, nil), {gen: 1, seq: 1, claim: claimA, bb: 3, fill: 'y', want: ErrStale}}, 2, 1, claimA.Holder},
		{"a seal before the stream refuses it", []step{{seal: true, gen: 1, claim: claimB}, put(1, 1, claimB, 0, ErrSealed), put(1, 1, claimA, 0, nil)}, 1, 1, claimA.Holder},
		{"a seal of another claim leaves the stream", []step{put(1, 1, claimA, 0, nil), {seal: true, gen: 1, claim: claimB}, put(1, 2, claimA, 0, nil), put(1, 1, claimB, 0, ErrSealed)}, 2, 1, claimA.Holder},
		{"a seal is of one generation", []step{{seal: true, gen: 1, claim: claimA}, put(2, 1, claimA, 0, nil)}, 1, 2, claimA.Holder},
		{"a new stream replaces a sealed one", []step{put(1, 1, claimA, 0, nil), {seal: true, gen: 1, claim: claimA}, put(1, 1, claimB, 0, nil), put(1, 2, claimA, 0, ErrSealed)}, 1, 1, claimB.Holder},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openSpool(t, t.TempDir())
			for i, st := range c.steps {
				if st.seal {
					if _, err := s.Seal(host, st.gen, st.claim); err != nil {
						t.Fatalf("step %d: Seal = %v", i+1, err)
					}
					continue
				}
				fill := st.fill
				if fill == 0 {
					fill = 'x'
				}
				err := s.Put(host, Entry{BucketBefore: st.bb, Data: segment(t, st.gen, st.seq, st.claim, fill)})
				wantErr(t, fmt.Sprintf("step %d: Put(gen %d, seq %d, %s)", i+1, st.gen, st.seq, st.claim.Holder), err, st.want)
			}
			got, _ := hostStatus(s, host)
			if got.LastSeq != c.last || got.Gen != c.lastGen || got.Holder != c.lastHold {
				t.Fatalf("status = %+v, want last seq %d of generation %d by %s", got, c.last, c.lastGen, c.lastHold)
			}
		})
	}
}

// TestPutRefusesMalformed: what is not a stream's data segment is refused and changes
// nothing.
func TestPutRefusesMalformed(t *testing.T) {
	s := openSpool(t, t.TempDir())
	mustPut(t, s, host, entry(t, 1, 1, claimA, 0))
	seal, err := spacestore.EncodeSegment(&spacestore.Segment{Gen: 1, Seq: 2, Claim: claimA, Seal: true})
	if err != nil {
		t.Fatal(err)
	}
	good := segment(t, 1, 2, claimA, 'x')
	flipped := bytes.Clone(good)
	flipped[len(flipped)-20] ^= 0x40
	before := s.Status()
	for name, e := range map[string]Entry{
		"garbage":         {Data: []byte("hello")},
		"empty":           {},
		"truncated":       {Data: good[:len(good)-1]},
		"a flipped byte":  {Data: flipped},
		"a seal segment":  {Data: seal},
		"negative bucket": {BucketBefore: -1, Data: good},
	} {
		wantErr(t, name, s.Put(host, e), ErrMalformed)
	}
	if got := s.Status(); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("status changed: %+v, was %+v", got, before)
	}
	mustPut(t, s, host, Entry{Data: good})
}

// TestHostNames: a name from the network is a host name or refused, and never reaches a
// path outside the spool.
func TestHostNames(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "spool")
	s := openSpool(t, dir)
	e := entry(t, 1, 1, claimA, 0)
	for _, h := range []string{"", ".", "..", "../x", "a/b", "a\\b", "a\x00b", "A.test", "a..b", ".a", "a.", "1.2.3.4", "a:80", strings.Repeat("a", 254), strings.Repeat("a", 64) + ".test"} {
		wantErr(t, fmt.Sprintf("Put(%q)", h), s.Put(h, e), ErrMalformed)
		_, err := s.Seal(h, 1, claimA)
		wantErr(t, fmt.Sprintf("Seal(%q)", h), err, ErrMalformed)
		wantErr(t, fmt.Sprintf("Drop(%q)", h), s.Drop(h), ErrMalformed)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 1 {
		t.Fatalf("the spool's parent holds %d names, want only the spool", len(ents))
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the spool holds %d names after refused hosts", len(ents))
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("spool dir mode = %v, %v; want 0700", fi.Mode(), err)
	}
}

// TestHostCap: a stream that would pass MaxHostBytes is refused with ErrFull and keeps what
// it had; a new generation's stream starts from nothing.
func TestHostCap(t *testing.T) {
	s := openSpool(t, t.TempDir())
	one := entry(t, 1, 1, claimA, 0)
	s.MaxHostBytes = 2*entrySize(one) + 10
	mustPut(t, s, host, one, entry(t, 1, 2, claimA, 0))
	err := s.Put(host, entry(t, 1, 3, claimA, 0))
	wantErr(t, "Put past the cap", err, ErrFull)
	if !strings.Contains(err.Error(), "cap") {
		t.Fatalf("the error does not say it is the cap: %v", err)
	}
	if st, _ := hostStatus(s, host); st.LastSeq != 2 {
		t.Fatalf("last seq = %d after a refused put", st.LastSeq)
	}
	mustPut(t, s, host, entry(t, 2, 1, claimA, 0))
	s.MaxHostBytes = entrySize(one) - 1
	wantErr(t, "an entry larger than the cap", s.Put(host, entry(t, 3, 1, claimA, 0)), ErrFull)
}

// TestRestartKeepsTheSpool: a spool opened again holds every stream, its entries and its
// seals, and a stream goes on where it was.
func TestRestartKeepsTheSpool(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	sealedWant := []Entry{entry(t, 2, 1, claimA, 1), entry(t, 2, 2, claimA, 2)}
	mustPut(t, s, "sealed.test", sealedWant...)
	if _, err := s.Seal("sealed.test", 2, claimA); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Seal("empty.test", 9, claimB); err != nil {
		t.Fatal(err)
	}
	liveWant := []Entry{entry(t, 1, 1, claimB, 0), entry(t, 1, 2, claimB, 0), entry(t, 1, 3, claimB, 5)}
	mustPut(t, s, "live.test", entry(t, 1, 1, claimA, 0), entry(t, 1, 2, claimA, 0)) // replaced next
	mustPut(t, s, "live.test", liveWant...)
	before := s.Status()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Put after Close", s.Put("live.test", entry(t, 1, 4, claimB, 5)), ErrClosed)

	s = openSpool(t, dir)
	if got := s.Status(); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("status after a restart:\n%+v\nwas\n%+v", got, before)
	}
	got, err := s.Seal("sealed.test", 2, claimA)
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, got, sealedWant)
	wantErr(t, "the sealed claim after a restart", s.Put("sealed.test", entry(t, 2, 3, claimA, 2)), ErrSealed)
	wantErr(t, "a seal without a stream after a restart", s.Put("empty.test", entry(t, 9, 1, claimB, 0)), ErrSealed)
	wantErr(t, "the replaced claim after a restart", s.Put("live.test", entry(t, 1, 3, claimA, 0)), ErrStale)
	mustPut(t, s, "live.test", liveWant[2], entry(t, 1, 4, claimB, 6))
	got, err = s.Seal("live.test", 1, claimB)
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, got, append(liveWant, entry(t, 1, 4, claimB, 6)))
}

// streamPath returns the one stream file of host in dir.
func streamPath(t *testing.T, dir, host string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, host, "*"+streamSuffix))
	if len(m) != 1 {
		t.Fatalf("%d stream files for %s", len(m), host)
	}
	return m[0]
}

// TestOpenCutsATornPut: a put cut by a crash (a record short or with a wrong checksum after
// the last good one, the file's zeros after it or its end) was never acknowledged, so Open
// cuts it off and the stream goes on; a bad record with entries after it is damage, and
// Open says where.
func TestOpenCutsATornPut(t *testing.T) {
	want := []Entry{entry(t, 1, 1, claimA, 0), entry(t, 1, 2, claimA, 0)}
	third := entry(t, 1, 3, claimA, 0)
	for name, tear := range map[string][]byte{
		"a short header": {0, 0, 1},
		"short data":     recordBytes(third)[:len(recordBytes(third))-7],
		"a wrong checksum": func() []byte {
			full := recordBytes(third)
			full[len(full)-1] ^= 1
			return full
		}(),
	} {
		for _, zeros := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s, zeros after it %v", name, zeros), func(t *testing.T) {
				dir := t.TempDir()
				s, _ := Open(dir)
				mustPut(t, s, host, want...)
				s.Close()
				p := streamPath(t, dir, host)
				end := recordsEnd(t, p)
				if fi, err := os.Stat(p); err != nil || fi.Size() <= end {
					t.Fatalf("the stream file ends with its records (%v, %v): no zeros ahead of them", fi.Size(), err)
				}
				if !zeros {
					os.Truncate(p, end) // a file written before the zeros
				}
				f, err := os.OpenFile(p, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.WriteAt(tear, end)
				f.Close()
				s = openSpool(t, dir)
				mustPut(t, s, host, third)
				got, err := s.Seal(host, 1, claimA)
				if err != nil {
					t.Fatal(err)
				}
				sameEntries(t, got, append(want, third))
				s.Close()
				s = openSpool(t, dir) // the third entry, written where the torn one was
				got, err = s.Seal(host, 1, claimA)
				if err != nil {
					t.Fatal(err)
				}
				sameEntries(t, got, append(want, third))
			})
		}
	}
	t.Run("damage in the middle", func(t *testing.T) {
		dir := t.TempDir()
		s, _ := Open(dir)
		mustPut(t, s, host, append(want, third)...)
		s.Close()
		p := streamPath(t, dir, host)
		b, _ := os.ReadFile(p)
		b[len(streamMagic)+recordHeader+100] ^= 1
		os.WriteFile(p, b, 0o600)
		if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), p) {
			t.Fatalf("Open = %v, want an error naming %s", err, p)
		}
	})
}

// recordBytes is e as a stream file's record.
func recordBytes(e Entry) []byte {
	st := &stream{}
	dir, _ := os.MkdirTemp("", "rec")
	defer os.RemoveAll(dir)
	st.f, _ = os.Create(filepath.Join(dir, "r"))
	defer st.f.Close()
	st.append(e)
	b, _ := os.ReadFile(filepath.Join(dir, "r"))
	return b[:st.size]
}

// recordsEnd is where the records of the stream file at p end: the zeros after them start.
func recordsEnd(t *testing.T, p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	off := len(streamMagic)
	for off+4 <= len(b) {
		n := int(binary.BigEndian.Uint32(b[off:]))
		if n == 0 {
			break
		}
		off += recordHeader + n
	}
	return int64(off)
}

// TestDrop: a dropped stream is gone (its file too, after a restart as well) and the holder
// must start again at seq 1; the seals outlive it.
func TestDrop(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	mustPut(t, s, "plain.test", entry(t, 1, 1, claimA, 0), entry(t, 1, 2, claimA, 0))
	mustPut(t, s, host, entry(t, 1, 1, claimA, 0))
	if _, err := s.Seal(host, 1, claimB); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"plain.test", host, "never.test"} {
		if err := s.Drop(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := hostStatus(s, "plain.test"); ok {
		t.Fatal("a dropped host with no seal is still listed")
	}
	if _, err := os.Stat(filepath.Join(dir, "plain.test")); !os.IsNotExist(err) {
		t.Fatalf("the dropped host's directory: %v", err)
	}
	wantErr(t, "the next seq after a drop", s.Put("plain.test", entry(t, 1, 3, claimA, 0)), ErrGap)
	if _, ok := hostStatus(s, "plain.test"); ok {
		t.Fatal("a refused put lists the host")
	}
	s.Close()
	s = openSpool(t, dir)
	if st, ok := hostStatus(s, host); !ok || st.LastSeq != 0 || st.Seals != 1 {
		t.Fatalf("status of a dropped host with a seal = %+v, %v", st, ok)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, host, "*"+streamSuffix)); len(m) != 0 {
		t.Fatalf("stream files left after a drop: %v", m)
	}
	wantErr(t, "the sealed claim after a drop", s.Put(host, entry(t, 1, 1, claimB, 0)), ErrSealed)
	mustPut(t, s, "plain.test", entry(t, 2, 1, claimA, 0))
}

// TestConcurrentHosts: puts of different hosts, seals and status reads at once (under -race)
// each keep their own stream whole.
func TestConcurrentHosts(t *testing.T) {
	s := openSpool(t, t.TempDir())
	const hosts, n = 6, 12
	segs := make([][]Entry, hosts)
	for h := range hosts {
		for q := int64(1); q <= n; q++ {
			segs[h] = append(segs[h], entry(t, int64(h), q, claimA, q))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, hosts*n)
	for h := range hosts {
		wg.Go(func() {
			for _, e := range segs[h] {
				if err := s.Put(fmt.Sprintf("h%d.test", h), e); err != nil {
					errs <- err
				}
				s.Status()
			}
		})
	}
	wg.Go(func() {
		for range n {
			if _, err := s.Seal("other.test", 1, claimB); err != nil {
				errs <- err
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for h := range hosts {
		got, err := s.Seal(fmt.Sprintf("h%d.test", h), int64(h), claimA)
		if err != nil {
			t.Fatal(err)
		}
		sameEntries(t, got, segs[h])
	}
}

// TestRetireDropsOnlyThatStream: a holder's retire (its checkpoint after the stream landed)
// drops its current stream, and nothing else: not another claim's, not a sealed one's,
// not after a restart of the spool that kept a newer stream.
func TestRetireDropsOnlyThatStream(t *testing.T) {
	sp, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	put := func(host string, gen, seq int64, c spacestore.Claim) {
		t.Helper()
		if err := sp.Put(host, Entry{Data: segment(t, gen, seq, c, byte(seq))}); err != nil {
			t.Fatal(err)
		}
	}
	lastSeq := func(host string) int64 {
		for _, st := range sp.Status() {
			if st.Host == host {
				return st.LastSeq
			}
		}
		return 0
	}
	put("a.test", 3, 1, claimA)
	put("a.test", 3, 2, claimA)
	if err := sp.Retire("a.test", 3, claimB); err != nil || lastSeq("a.test") != 2 {
		t.Fatalf("another claim's retire: %v, last seq %d", err, lastSeq("a.test"))
	}
	if err := sp.Retire("a.test", 2, claimA); err != nil || lastSeq("a.test") != 2 {
		t.Fatalf("another generation's retire: %v, last seq %d", err, lastSeq("a.test"))
	}
	if err := sp.Retire("a.test", 3, claimA); err != nil || lastSeq("a.test") != 0 {
		t.Fatalf("the stream's own retire: %v, last seq %d", err, lastSeq("a.test"))
	}
	put("b.test", 1, 1, claimA)
	if _, err := sp.Seal("b.test", 1, claimA); err != nil {
		t.Fatal(err)
	}
	if err := sp.Retire("b.test", 1, claimA); err != nil || lastSeq("b.test") != 1 {
		t.Fatalf("a sealed stream's retire: %v, last seq %d", err, lastSeq("b.test"))
	}
	if err := sp.Retire("none.test", 1, claimA); err != nil {
		t.Fatalf("retiring a host with no stream: %v", err)
	}
}

// TestOutOfOrderPutsWaitTheirTurn: a holder sends several segments of its stream at once;
// the ones that arrive before their predecessors (the stream's start included) wait for
// them and land in order, each answered once on disk; a segment whose predecessor never
// comes is refused after the wait.
func TestOutOfOrderPutsWaitTheirTurn(t *testing.T) {
	sp, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for _, seq := range []int64{4, 3, 2} {
		go func() {
			errs <- sp.Put("o.test", Entry{BucketBefore: seq, Data: segment(t, 1, seq, claimA, byte(seq))})
		}()
	}
	time.Sleep(50 * time.Millisecond) // let them wait: the stream has not started
	if err := sp.Put("o.test", Entry{Data: segment(t, 1, 1, claimA, 1)}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("a put that arrived early: %v", err)
		}
	}
	ents, err := sp.Seal("o.test", 1, claimA)
	if err != nil || len(ents) != 4 {
		t.Fatalf("sealed %d entries (%v), want 4", len(ents), err)
	}
	if err := CheckSealed(ents, 1, claimA); err != nil {
		t.Fatal(err)
	}
	if err := sp.Put("p.test", Entry{Data: segment(t, 1, 1, claimA, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := sp.Put("p.test", Entry{Data: segment(t, 1, 3, claimA, 3)}); !errors.Is(err, ErrGap) {
		t.Fatalf("seq 3 with seq 2 never sent: %v, want ErrGap after the wait", err)
	}
}

// TestStartedOncePerStream: Started hears each stream a put starts (its host and
// generation), after the put, and nothing of the puts that extend it or that are refused.
func TestStartedOncePerStream(t *testing.T) {
	s := openSpool(t, t.TempDir())
	var got []string
	s.Started = func(host string, gen int64) {
		_ = s.Status() // the host's lock is free again
		got = append(got, fmt.Sprintf("%s/%d", host, gen))
	}
	mustPut(t, s, "a.test", entry(t, 1, 1, claimA, 0), entry(t, 1, 2, claimA, 0))
	if err := s.Put("a.test", entry(t, 1, 4, claimA, 0)); !errors.Is(err, ErrGap) {
		t.Fatalf("a gap: %v", err)
	}
	mustPut(t, s, "a.test", entry(t, 2, 1, claimA, 0), entry(t, 2, 2, claimA, 0))
	mustPut(t, s, "b.test", entry(t, 5, 1, claimB, 0))
	want := []string{"a.test/1", "a.test/2", "b.test/5"}
	if !slices.Equal(got, want) {
		t.Fatalf("Started heard %v, want %v", got, want)
	}
}
