package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/gate"
	"github.com/lchat/lchat-caddy/internal/testwait"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/standby"
)

// spoolLink is a StandbyLink between engines of one test: each box's spool is a real
// standby.Spool in its own directory, reached by a call instead of the peer API.
type spoolLink struct {
	self   string
	spools map[string]*standby.Spool
	mu     *sync.Mutex
	dead   map[string]bool
	// beating names the dead boxes whose heartbeat still looks live (killed within
	// dead_after): their leases hold but for a TakeOver.
	beating map[string]bool
	// unlisted names the boxes that answer but are not live members (their heartbeats
	// stale: their bucket link is cut).
	unlisted map[string]bool
	// silent is how long ago each dead box last beat; a dead box not named here is long
	// gone (past standbyGoneAfter).
	silent map[string]time.Duration
	// left names the dead boxes with no heartbeat at all (a clean exit deleted it).
	left map[string]bool
	puts *atomic.Int64
}

func (l spoolLink) Pick(host string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, box := range slices.Sorted(maps.Keys(l.spools)) {
		if box != l.self && !l.dead[box] {
			return box, true
		}
	}
	return "", false
}

func (l spoolLink) Put(ctx context.Context, box, host string, e standby.Entry) error {
	if !l.reachable(box) {
		return errors.New("connection refused")
	}
	l.puts.Add(1)
	return l.spools[box].Put(host, e)
}

func (l spoolLink) Seal(ctx context.Context, box, host string, gen int64, claim spacestore.Claim) ([]standby.Entry, error) {
	if !l.reachable(box) {
		return nil, errors.New("connection refused")
	}
	return l.spools[box].Seal(host, gen, claim)
}

func (l spoolLink) Retire(ctx context.Context, box, host string, gen int64, claim spacestore.Claim, handover bool) error {
	if !l.reachable(box) {
		return errors.New("connection refused")
	}
	if handover {
		return l.spools[box].Handover(host, gen, claim)
	}
	return l.spools[box].Retire(host, gen, claim)
}

func (l spoolLink) Live(box string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.dead[box] && !l.unlisted[box]
}

func (l spoolLink) SilentFor(ctx context.Context, box string) (time.Duration, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left[box] {
		return 0, false, nil
	}
	if d, ok := l.silent[box]; ok {
		return d, true, nil
	}
	if l.dead[box] {
		return standbyGoneAfter + time.Second, true, nil
	}
	return 0, true, nil
}

func (l spoolLink) reachable(box string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.dead[box]
}

// logCut is a box's way to the bucket that can be cut: its writes fail, as from a box cut
// off from the bucket, while its reads (and the test's) go on.
type logCut struct {
	bucket.Bucket
	cut atomic.Bool
	// loseManifestAnswer: the next manifest write lands and its answer is lost.
	loseManifestAnswer atomic.Bool
	// objGets counts the GETs of the spaces' checkpoint objects (a restore's downloads).
	objGets atomic.Int64
	// leaseHold, when set, holds each lease write until it is closed.
	leaseHold atomic.Pointer[chan struct{}]
}

func (b *logCut) Get(ctx context.Context, key string) (*bucket.Object, error) {
	if strings.Contains(key, "/objs/") || strings.Contains(key, "/blobs/") {
		b.objGets.Add(1)
	}
	return b.Bucket.Get(ctx, key)
}

func (b *logCut) Put(ctx context.Context, key string, r io.Reader, size int64, c bucket.Cond) (bucket.Info, error) {
	if b.cut.Load() {
		return bucket.Info{}, errors.New("bucket unreachable")
	}
	if h := b.leaseHold.Load(); h != nil && strings.HasSuffix(key, "/lease") {
		<-*h
	}
	info, err := b.Bucket.Put(ctx, key, r, size, c)
	if err == nil && strings.HasSuffix(key, "/manifest") && b.loseManifestAnswer.CompareAndSwap(true, false) {
		return bucket.Info{}, errors.New("connection reset: the answer was lost")
	}
	return info, err
}

// standbyFleet is two engines sharing a file bucket, each with a spool, spaces of kind
// "app" on standby durability.
type standbyFleet struct {
	engines map[string]*Engine
	buckets map[string]*logCut
	link    spoolLink
}

func newStandbyFleet(t *testing.T, boxes ...string) *standbyFleet {
	t.Helper()
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f := &standbyFleet{engines: map[string]*Engine{}, buckets: map[string]*logCut{}}
	spools := map[string]*standby.Spool{}
	for _, box := range boxes {
		sp, err := standby.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		spools[box] = sp
	}
	var mu sync.Mutex
	dead, beating, unlisted := map[string]bool{}, map[string]bool{}, map[string]bool{}
	silent, left := map[string]time.Duration{}, map[string]bool{}
	puts := new(atomic.Int64)
	for _, box := range boxes {
		dir, err := os.MkdirTemp("", "eng")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		lb := &logCut{Bucket: fb}
		link := spoolLink{self: box, spools: spools, mu: &mu, dead: dead, beating: beating, unlisted: unlisted, silent: silent, left: left, puts: puts}
		e, err := New(Config{
			Bucket: lb, StateDir: dir, Holder: box, Incarnation: "1",
			Kinds: map[string]Kind{"app": {
				Command:     self,
				Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
				Replication: Replication{Class: ReplicateSleep},
				StopGrace:   5 * time.Second,
				Durability:  DurabilityStandby,
			}, "bkt": {
				Command:     self,
				Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
				Replication: Replication{Class: ReplicateSleep},
				StopGrace:   5 * time.Second,
				Durability:  DurabilityBucket,
			}, "ckpt": {
				Command:     self,
				Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
				Replication: Replication{Class: ReplicateSleep},
				Durability:  DurabilityCheckpoint,
			}},
			Resolve: func(host string) (Space, bool) { return Space{Host: host, Kind: "app"}, true },
			HolderLive: func(holder, _ string) bool {
				mu.Lock()
				defer mu.Unlock()
				return !dead[holder] || beating[holder]
			},
			Standby: link,
		})
		if err != nil {
			t.Fatal(err)
		}
		drainAtEnd(t, e)
		f.engines[box], f.buckets[box] = e, lb
		f.link = link
	}
	return f
}

func (f *standbyFleet) kill(box string) {
	f.link.mu.Lock()
	f.link.dead[box] = true
	f.link.mu.Unlock()
}

// killSilentFor kills box, its last heartbeat written silent ago.
func (f *standbyFleet) killSilentFor(box string, silent time.Duration) {
	f.link.mu.Lock()
	f.link.dead[box], f.link.silent[box] = true, silent
	f.link.mu.Unlock()
}

// leave stops box cleanly: its heartbeat deleted, its spool kept on its disk.
func (f *standbyFleet) leave(box string) {
	f.link.mu.Lock()
	f.link.dead[box], f.link.left[box] = true, true
	f.link.mu.Unlock()
}

// restart brings a killed box back: its spool as it was on disk.
func (f *standbyFleet) restart(box string) {
	f.link.mu.Lock()
	delete(f.link.dead, box)
	delete(f.link.silent, box)
	delete(f.link.left, box)
	f.link.mu.Unlock()
}

// killBeating kills box within dead_after: its heartbeat still looks live, so its leases
// hold against a plain wake, but not against a TakeOver.
func (f *standbyFleet) killBeating(box string) {
	f.link.mu.Lock()
	f.link.dead[box], f.link.beating[box] = true, true
	f.link.mu.Unlock()
}

// openDB opens the space's app.db on e as its instance would.
func openDB(t *testing.T, e *Engine, host string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(e.get(host).dataDir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

// awakeSpace is a space awake on one engine of a test, its database written as its
// instance would write it.
type awakeSpace struct {
	t  *testing.T
	u  *Use
	db *sql.DB
}

// wake wakes host, of kind app (standby), on e (released at the test's end) and opens its
// database.
func wake(t *testing.T, e *Engine, host string) *awakeSpace {
	t.Helper()
	return wakeKind(t, e, host, "app")
}

// wakeKind is wake for a space of kind.
func wakeKind(t *testing.T, e *Engine, host, kind string) *awakeSpace {
	t.Helper()
	u, err := e.Acquire(context.Background(), Space{Host: host, Kind: kind})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Release)
	return &awakeSpace{t: t, u: u, db: openDB(t, e, host)}
}

// write commits q and returns what the answer's wait at the gate gives (ctx bounds it).
func (s *awakeSpace) write(ctx context.Context, q string) error {
	s.t.Helper()
	if _, err := s.db.Exec(q); err != nil {
		s.t.Fatal(err)
	}
	return s.u.WaitDurable(ctx)
}

// acknowledged commits each statement and fails the test unless each is acknowledged.
func (s *awakeSpace) acknowledged(qs ...string) {
	s.t.Helper()
	for _, q := range qs {
		if err := s.write(context.Background(), q); err != nil {
			s.t.Fatalf("%s: %v", q, err)
		}
	}
}

// rowsOn wakes host on e and counts the rows of its table m.
func rowsOn(t *testing.T, e *Engine, host string) int {
	t.Helper()
	return rowsOfKind(t, e, host, "app")
}

// rowsOfKind is rowsOn for a space of kind.
func rowsOfKind(t *testing.T, e *Engine, host, kind string) int {
	t.Helper()
	var n int
	if err := wakeKind(t, e, host, kind).db.QueryRow("SELECT count(*) FROM m").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

const createM = "CREATE TABLE m (id INTEGER PRIMARY KEY, body TEXT)"

func insertM(body string) string { return fmt.Sprintf("INSERT INTO m (body) VALUES ('%s')", body) }

// TestStandbyTakeoverKeepsWhatTheStandbyAcknowledged: a holder cut off from the bucket
// acknowledges writes on its standby's word alone; killed, its space is taken over by the
// standby's box, which finds every acknowledged write (the stream taken from its spool, the
// bucket log lacking them), writes them to the bucket log before it seals it, and the old
// holder acknowledges nothing more (the stream is sealed).
func TestStandbyTakeoverKeepsWhatTheStandbyAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	const host = "standby.example.com"
	f := newStandbyFleet(t, "box-a", "box-b", "box-c")
	a, b := f.engines["box-a"], f.engines["box-b"]
	sp := wake(t, a, host)
	sp.acknowledged(createM)
	for i := range 20 {
		sp.acknowledged(insertM(fmt.Sprint("before ", i)))
	}
	if st := logStatusOf(t, a, host); st.Standby == nil || st.Standby.Box != "box-b" || st.Standby.Streamed == 0 {
		t.Fatalf("status %+v: want a stream to box-b", st.Standby)
	}
	// The bucket log has the first rows (its cut, once a second, landed); the stream goes on
	// from the wake's seal, so the takeover rebuilds from both.
	if err := a.get(host).durableOf().gate.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// Cut from the bucket, the holder still acknowledges: the standby has each write.
	f.buckets["box-a"].cut.Store(true)
	for i := range 30 {
		sp.acknowledged(insertM(fmt.Sprint("after ", i)))
	}
	f.kill("box-a")
	if n := rowsOn(t, b, host); n != 50 {
		t.Fatalf("the taker has %d of the 50 acknowledged rows", n)
	}
	// The old holder, still running, acknowledges nothing more: its stream is sealed.
	f.link.mu.Lock()
	delete(f.link.dead, "box-a") // it comes back from a pause, say
	f.link.mu.Unlock()
	if err := sp.write(ctx, insertM("late")); !errors.Is(err, gate.ErrNotDurable) {
		t.Fatalf("the old holder acknowledged a write after the takeover: %v", err)
	}
	// The bucket log alone now carries every acknowledged row (the stream was written to it
	// before the seal): with box-b gone too, cut from the bucket and from its standby
	// before it streamed anything, box-c finds them all.
	f.buckets["box-b"].cut.Store(true)
	f.kill("box-b")
	f.kill("box-a")
	if n := rowsOn(t, f.engines["box-c"], host); n != 50 {
		t.Fatalf("from the bucket log alone: %d of the 50 acknowledged rows", n)
	}
}

// TestStandbyLostFallsBackToTheBucket: a holder whose standby dies acknowledges on bucket
// proofs, says so in its status, and with the bucket cut as well acknowledges nothing: a
// write is never acknowledged on one box's disk alone.
func TestStandbyLostFallsBackToTheBucket(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	const host = "lost.example.com"
	f := newStandbyFleet(t, "box-a", "box-b")
	a := f.engines["box-a"]
	sp := wake(t, a, host)
	sp.acknowledged(createM)
	f.kill("box-b")
	before := logStatusOf(t, a, host)
	if err := sp.write(ctx, insertM("x")); err != nil {
		t.Fatalf("with the standby dead and the bucket up: %v", err)
	}
	st := logStatusOf(t, a, host)
	// In the bucket: a segment of the log, or the checkpoint that losing the standby asked
	// for (a new generation, the next stream's start).
	if st.Segments <= before.Segments && st.Generation <= before.Generation {
		t.Fatalf("acknowledged with no standby and nothing new in the bucket: %+v", st)
	}
	if st.Standby == nil || st.Standby.Box != "" || st.Standby.NoStandby == "" || st.Standby.Lost != 1 {
		t.Fatalf("status %+v: want the standby given up, and why", st.Standby)
	}
	f.buckets["box-a"].cut.Store(true)
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := sp.write(wctx, insertM("y")); !errors.Is(err, gate.ErrNotDurable) {
		t.Fatalf("acknowledged with neither a standby nor the bucket: %v", err)
	}
}

// TestTakeoverPrefersTheNewerLog: when the bucket log was cut after the stream's last
// segment (commits the holder made after its last answer, shipped by the bucket's timer),
// the takeover restores from the bucket log, which holds them, not from the stream.
func TestTakeoverPrefersTheNewerLog(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	const host = "newer.example.com"
	f := newStandbyFleet(t, "box-a", "box-b")
	a, b := f.engines["box-a"], f.engines["box-b"]
	sp := wake(t, a, host)
	sp.acknowledged(createM, insertM("answered"))
	// Committed with no answer waiting: only the bucket's cut takes it.
	if _, err := sp.db.Exec(insertM("unanswered")); err != nil {
		t.Fatal(err)
	}
	if err := a.get(host).durableOf().gate.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	f.buckets["box-a"].cut.Store(true)
	f.kill("box-a")
	if n := rowsOn(t, b, host); n != 2 {
		t.Fatalf("the taker has %d rows, want both (the bucket log is the newer)", n)
	}
}

// TestTakeOverBeforeTheHeartbeatDies: a holder killed while its heartbeat still looks live
// holds its lease against a plain wake; TakeOver, told the holder is gone, takes the space
// over at once with every acknowledged write. A kind that does not acknowledge through a
// stream is not taken over early.
func TestTakeOverBeforeTheHeartbeatDies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	const host = "early.example.com"
	f := newStandbyFleet(t, "box-a", "box-b")
	a, b := f.engines["box-a"], f.engines["box-b"]
	wake(t, a, host).acknowledged(createM, insertM("one"), insertM("two"))
	f.buckets["box-a"].cut.Store(true)
	f.killBeating("box-a")
	var held *LeaseHeldError
	if _, err := b.Acquire(ctx, Space{Host: host, Kind: "app"}); !errors.As(err, &held) {
		t.Fatalf("a plain wake while the holder's heartbeat looks live: %v, want the lease held", err)
	}
	ub, err := b.TakeOver(ctx, Space{Host: host, Kind: "app"}, "box-a", "1")
	if err != nil {
		t.Fatal(err)
	}
	defer ub.Release()
	if n := rowsOn(t, b, host); n != 2 {
		t.Fatalf("after the takeover: %d rows, want 2", n)
	}
	if _, err := b.TakeOver(ctx, Space{Host: "other.example.com", Kind: "ckpt"}, "box-a", "1"); !errors.Is(err, ErrNotStandby) {
		t.Fatalf("TakeOver of a checkpoint kind: %v", err)
	}
}

// TestStandbyWithoutAMeshSaysWhy: a standby kind on a box with no mesh acknowledges on
// bucket proofs and its status says why it has no standby.
func TestStandbyWithoutAMeshSaysWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real instance")
	}
	const host = "alone.example.com"
	f := newStandbyFleet(t, "box-a")
	a := f.engines["box-a"]
	a.cfg.Standby = nil // as a box without a mesh is configured
	wake(t, a, host).acknowledged(createM)
	st := logStatusOf(t, a, host)
	if st.Standby == nil || st.Standby.Box != "" || !strings.Contains(st.Standby.NoStandby, "not in a mesh") || st.Segments == 0 {
		t.Fatalf("status %+v, standby %+v: want the bucket's proofs and why there is no standby", st, st.Standby)
	}
}

// TestSleepRetiresTheStream: once a space's final checkpoint has landed, its standby drops
// the stream (the checkpoint holds what it carried); the standby keeps nothing of a slept
// space, and a wake elsewhere later starts from the bucket.
func TestSleepRetiresTheStream(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real instance")
	}
	const host = "retire.example.com"
	f := newStandbyFleet(t, "box-a", "box-b")
	a := f.engines["box-a"]
	sp := wake(t, a, host)
	sp.acknowledged(createM)
	spool := f.link.spools["box-b"]
	kept := func() int64 {
		for _, st := range spool.Status() {
			if st.Host == host {
				return st.LastSeq
			}
		}
		return 0
	}
	if kept() == 0 {
		t.Fatal("the standby has no stream of the awake space")
	}
	sp.db.Close()
	sp.u.Release()
	if err := a.Sleep(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	testwait.WaitFor(t, 10*time.Second, "the standby dropping the slept space's stream", func() bool { return kept() == 0 })
}

// TestLostManifestAnswerAcknowledgesNothingUntilSettled: a checkpoint whose manifest write
// lands with its answer lost leaves the bucket a generation ahead of what the holder
// believes; a write acknowledged through the old generation's stream or log then would be
// ignored by a takeover restoring the new one (the fault campaign lost 4 writes of a
// standby space so). The holder acknowledges nothing until a checkpoint settles the write,
// and every write it did acknowledge is on the box that takes the space over. For both
// durabilities that ship a log.
func TestLostManifestAnswerAcknowledgesNothingUntilSettled(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	for _, kind := range []string{"app", "bkt"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			const host = "unsure.example.com"
			f := newStandbyFleet(t, "box-a", "box-b")
			a, b := f.engines["box-a"], f.engines["box-b"]
			sp := wakeKind(t, a, host, kind)
			sp.acknowledged(createM, insertM("before"))
			if _, err := sp.db.Exec(insertM("in the checkpoint")); err != nil {
				t.Fatal(err)
			}
			f.buckets["box-a"].loseManifestAnswer.Store(true)
			a.CheckpointNow(ctx, host) // lands; its answer is lost
			if f.buckets["box-a"].loseManifestAnswer.Load() {
				t.Fatal("the checkpoint wrote no manifest")
			}
			sp.acknowledged(insertM("after"))
			f.buckets["box-a"].cut.Store(true)
			f.kill("box-a")
			if n := rowsOfKind(t, b, host, kind); n != 3 {
				t.Fatalf("the taker has %d of the 3 rows (all acknowledged or in a checkpoint)", n)
			}
		})
	}
}

// TestCutAfterAnUnsureCheckpointShipsNothing: a cut that waited for a checkpoint (the
// durable's mu) whose manifest write's outcome is unknown ships nothing: that manifest may
// be a generation ahead, read by a takeover that ignores the older log and stream, and the
// commits the cut would take came after the checkpoint read the files. The answer waiting
// on it is released only once a checkpoint settles the write (unsureRetry at the
// earliest). Found by a 30-minute campaign: a standby holder acknowledged a write on the
// old generation's stream right after such a checkpoint, and the taker lost it.
func TestCutAfterAnUnsureCheckpointShipsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	for _, kind := range []string{"app", "bkt"} {
		t.Run(kind, func(t *testing.T) {
			const host = "unsurecut.example.com"
			f := newStandbyFleet(t, "box-a", "box-b")
			a := f.engines["box-a"]
			sp := wakeKind(t, a, host, kind)
			sp.acknowledged(createM, insertM("before"))
			d := a.get(host).durableOf()
			d.mu.Lock() // a checkpoint in progress
			if _, err := sp.db.Exec(insertM("during")); err != nil {
				d.mu.Unlock()
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				done <- sp.u.WaitDurable(ctx)
			}()
			time.Sleep(200 * time.Millisecond) // the gate's cut is past its first look, at d.mu
			d.unsure.Store(true)               // the checkpoint's manifest write: unknown
			released := time.Now()
			d.mu.Unlock()
			if err := <-done; err != nil {
				t.Fatalf("the answer after the settling checkpoint: %v", err)
			}
			if took := time.Since(released); took < unsureRetry*9/10 {
				t.Fatalf("acknowledged %v after the unsure checkpoint, before any checkpoint could settle it (%v)", took, unsureRetry)
			}
		})
	}
}

// TestFencedSleepKeepsTheStandbysStream: a space put to sleep while its box is fenced
// writes no checkpoint, so its standby's stream stays the only copy of what it acknowledged
// since the last one: the stop does not ask the standby to drop it, and the taker finds
// every acknowledged write. Found by a 10-minute campaign: a holder frozen (SIGSTOP) as its
// idle sleep began resumed fenced, slept without writing, retired its stream, and the
// standby's takeover lost the write acknowledged on it.
func TestFencedSleepKeepsTheStandbysStream(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	const host = "fencedsleep.example.com"
	f := newStandbyFleet(t, "box-a", "box-b")
	a, b := f.engines["box-a"], f.engines["box-b"]
	sp := wake(t, a, host)
	sp.acknowledged(createM, insertM("checkpointed"))
	in := a.get(host)
	a.syncNow(ctx, in) // a new generation: its stream starts with the next write
	sp.acknowledged(insertM("streamed"))
	gen := in.durableOf().gen.Load()
	in.op.Lock()
	a.SetFenced(true) // its stops of every space wait for in.op
	if _, err := a.stopOpHeld(ctx, in, stopSpec{reason: reasonIdle, outcome: stopSave}); err != nil {
		in.op.Unlock()
		t.Fatalf("the fenced sleep: %v", err)
	}
	in.op.Unlock()
	time.Sleep(500 * time.Millisecond) // a retire is sent in the background
	var kept bool
	for _, h := range f.link.spools["box-b"].Status() {
		kept = kept || h.Host == host && h.Gen == gen && h.LastSeq > 0
	}
	if !kept {
		t.Fatalf("box-b's spool after the fenced sleep: %+v, want the stream of generation %d", f.link.spools["box-b"].Status(), gen)
	}
	f.kill("box-a")
	if n := rowsOn(t, b, host); n != 2 {
		t.Fatalf("the taker has %d of the 2 acknowledged rows", n)
	}
}

// TestTakeoverOnAWarmStandbyDownloadsNoCheckpoint: the standby's box warms the space's
// checkpoint when a stream of a new generation starts there (Prewarm, from its spool), so
// its takeover reads no checkpoint object from the bucket and still finds every
// acknowledged write: the checkpoint's, the bucket log's and the stream's. A wake tried
// there before the takeover, refused the lease, leaves the copy warm.
func TestTakeoverOnAWarmStandbyDownloadsNoCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	const host = "warm.example.com"
	f := newStandbyFleet(t, "box-a", "box-b")
	a, b := f.engines["box-a"], f.engines["box-b"]
	f.link.spools["box-b"].Started = func(host string, _ int64) { b.Prewarm(host) }
	sp := wake(t, a, host)
	sp.acknowledged(createM)
	for i := range 20 {
		sp.acknowledged(insertM(strings.Repeat(fmt.Sprint("checkpointed ", i), 500)))
	}
	// A checkpoint starts a new generation and its stream: its first segment warms box-b.
	in := a.get(host)
	a.syncNow(context.Background(), in)
	gen := in.durableOf().gen.Load()
	for i := range 10 {
		sp.acknowledged(insertM(fmt.Sprint("streamed ", i)))
	}
	testwait.WaitFor(t, 10*time.Second, "box-b's copy of generation "+fmt.Sprint(gen)+" warm", func() bool {
		g, ok := b.WarmGeneration(host)
		return ok && g == gen
	})
	// A request reaching box-b while box-a still holds the space (its heartbeat live)
	// tries a wake there, which restores and is refused the lease: the copy stays warm.
	var held *LeaseHeldError
	if _, err := b.Acquire(context.Background(), Space{Host: host, Kind: "app"}); !errors.As(err, &held) {
		t.Fatalf("a wake on box-b while box-a holds the space: %v, want the lease held", err)
	}
	f.kill("box-a")
	gets := f.buckets["box-b"].objGets.Load()
	if n := rowsOn(t, b, host); n != 30 {
		t.Fatalf("the taker has %d of the 30 acknowledged rows", n)
	}
	if got := f.buckets["box-b"].objGets.Load() - gets; got != 0 {
		t.Errorf("the takeover read %d checkpoint objects; the warm copy should have spared them all", got)
	}
	if !b.get(host).lastWakeKept.Load() {
		t.Error("the takeover's wake did not keep the warm data dir")
	}
	if _, ok := b.WarmGeneration(host); ok {
		t.Error("the wake left the copy counted warm")
	}
}

// TestDrainHandsTheSpaceToAWarmStandby: a holder's drain puts the space to sleep and hands
// it over to its standby (the retire says so), whose box warms the final checkpoint: the
// wake there downloads nothing and finds every acknowledged write.
func TestDrainHandsTheSpaceToAWarmStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	const host = "handover.example.com"
	f := newStandbyFleet(t, "box-a", "box-b")
	a, b := f.engines["box-a"], f.engines["box-b"]
	f.link.spools["box-b"].HandedOver = b.Prewarm
	sp := wake(t, a, host)
	sp.acknowledged(createM)
	for i := range 20 {
		sp.acknowledged(insertM(strings.Repeat(fmt.Sprint("row ", i), 500)))
	}
	sp.u.Release()
	if err := a.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	m, _, err := spacestore.ReadManifest(context.Background(), f.buckets["box-b"], host)
	if err != nil || m == nil {
		t.Fatalf("the drain's checkpoint: %v", err)
	}
	testwait.WaitFor(t, 10*time.Second, "box-b's copy of the drain's checkpoint warm", func() bool {
		g, ok := b.WarmGeneration(host)
		return ok && g == m.Generation
	})
	gets := f.buckets["box-b"].objGets.Load()
	if n := rowsOn(t, b, host); n != 20 {
		t.Fatalf("box-b has %d of the 20 acknowledged rows", n)
	}
	if got := f.buckets["box-b"].objGets.Load() - gets; got != 0 {
		t.Errorf("the wake after the handover read %d checkpoint objects, want 0", got)
	}
}

// TestTakeOverJoiningAPlainWake: a request reaches the standby's box as the holder dies, and
// its plain wake (which counts the holder live: its heartbeat is) is in flight when the
// watch's verdict calls TakeOver, which joins that wake. The wake is refused the lease; the
// takeover does not take that refusal as its own: it tries again with its verdict and takes
// the space over.
func TestTakeOverJoiningAPlainWake(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	const host = "joined.example.com"
	f := newStandbyFleet(t, "box-a", "box-b")
	a, b := f.engines["box-a"], f.engines["box-b"]
	wake(t, a, host).acknowledged(createM, insertM("one"))
	f.killBeating("box-a")
	hold := make(chan struct{})
	f.buckets["box-b"].leaseHold.Store(&hold)
	plain := make(chan error, 1)
	go func() {
		u, err := b.Acquire(ctx, Space{Host: host, Kind: "app"})
		if err == nil {
			u.Release()
		}
		plain <- err
	}()
	in := b.get(host)
	testwait.WaitFor(t, 5*time.Second, "the plain wake in flight", func() bool {
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.state == StateWaking
	})
	took := make(chan error, 1)
	go func() {
		u, err := b.TakeOver(ctx, Space{Host: host, Kind: "app"}, "box-a", "1")
		if err == nil {
			defer u.Release()
		}
		took <- err
	}()
	testwait.WaitFor(t, 5*time.Second, "the takeover's verdict noted", func() bool {
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.goneHolder[0] == "box-a"
	})
	f.buckets["box-b"].leaseHold.Store(nil)
	close(hold)
	var held *LeaseHeldError
	if err := <-plain; !errors.As(err, &held) {
		t.Fatalf("the plain wake: %v, want the lease held (it counts the holder live)", err)
	}
	if err := <-took; err != nil {
		t.Fatalf("the takeover that joined the plain wake: %v", err)
	}
}

// TestTakeoverTakesTheStreamOfAnUnlistedStandby: the holder's and the standby's bucket links
// are cut at once (a stalled store): the holder goes on acknowledging on its standby's word,
// the standby's heartbeat goes stale (it is no longer a live member) but it answers; the
// holder dies; the takeover on a third box seals the stream on the standby all the same and
// finds every acknowledged write, where it used to count the standby dead and lose them.
func TestTakeoverTakesTheStreamOfAnUnlistedStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	const host = "unlisted.example.com"
	f := newStandbyFleet(t, "box-a", "box-b", "box-c")
	a, c := f.engines["box-a"], f.engines["box-c"]
	sp := wake(t, a, host)
	sp.acknowledged(createM, insertM("one"))
	if st := logStatusOf(t, a, host); st.Standby == nil || st.Standby.Box != "box-b" {
		t.Fatalf("status %+v: want a stream to box-b", st.Standby)
	}
	f.buckets["box-a"].cut.Store(true)
	f.buckets["box-b"].cut.Store(true)
	for i := range 10 {
		sp.acknowledged(insertM(fmt.Sprint("cut ", i)))
	}
	f.link.mu.Lock()
	f.link.unlisted["box-b"] = true
	f.link.mu.Unlock()
	f.kill("box-a")
	if n := rowsOn(t, c, host); n != 11 {
		t.Fatalf("the taker has %d of the 11 acknowledged rows", n)
	}
}

// TestStandbyRetryBacksOff: a standby given up is not asked again before 5 s, then 10 s,
// up to a minute while it keeps failing; once it takes a segment it is asked at once, and
// another box given up starts from 5 s.
func TestStandbyRetryBacksOff(t *testing.T) {
	var r standbyRetry
	now := time.Unix(1e9, 0)
	for _, want := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, time.Minute, time.Minute} {
		until := r.lost("https://b", now)
		if until.Sub(now) != want {
			t.Fatalf("given up again: asked again after %v, want %v", until.Sub(now), want)
		}
		if _, wait := r.waiting("https://b", now.Add(want-time.Millisecond)); !wait {
			t.Fatalf("asked again before %v", want)
		}
		if _, wait := r.waiting("https://b", now.Add(want)); wait {
			t.Fatalf("not asked again at %v", want)
		}
		if _, wait := r.waiting("https://c", now); wait {
			t.Fatal("another box waits for b's retry")
		}
	}
	r.lost("https://c", now)
	if _, wait := r.waiting("https://b", now); wait {
		t.Fatal("b still waits once c was given up since")
	}
	if until := r.lost("https://b", now); until.Sub(now) != standbyRetryFirst {
		t.Fatalf("b given up after c: %v, want %v", until.Sub(now), standbyRetryFirst)
	}
	r.answered("https://b")
	if _, wait := r.waiting("https://b", now); wait {
		t.Fatal("b waits after it took a segment")
	}
	if until := r.lost("https://b", now); until.Sub(now) != standbyRetryFirst {
		t.Fatalf("b given up after it answered: %v, want %v", until.Sub(now), standbyRetryFirst)
	}
}

// ackedOnTheStandbyOnly wakes each of hosts on box-a, its stream on box-b, with one row in
// the bucket log; then cuts box-a off from the bucket and has it acknowledge 10 more rows
// of each on box-b's word alone.
func ackedOnTheStandbyOnly(t *testing.T, f *standbyFleet, hosts []string) {
	t.Helper()
	a := f.engines["box-a"]
	var spaces []*awakeSpace
	for _, host := range hosts {
		sp := wake(t, a, host)
		sp.acknowledged(createM, insertM("before"))
		if err := a.get(host).durableOf().gate.Wait(context.Background()); err != nil { // the bucket log has it
			t.Fatal(err)
		}
		if st := logStatusOf(t, a, host); st.Standby == nil || st.Standby.Box != "box-b" {
			t.Fatalf("%s: status %+v, want a stream to box-b", host, st.Standby)
		}
		spaces = append(spaces, sp)
	}
	f.buckets["box-a"].cut.Store(true)
	for _, sp := range spaces {
		for i := range 10 {
			sp.acknowledged(insertM(fmt.Sprint("cut ", i)))
		}
	}
}

// TestTakeoverWaitsForARestartingStandby: the holder, cut off from the bucket, acknowledges
// writes on its standby's word; then the standby is killed (a restart) and the holder dies.
// A takeover on a third box finds the standby neither live nor answering: while its last
// heartbeat is seconds old the takeover fails (the space stays dark) rather than lose what
// only the standby's disk holds, and once the standby is back it takes every acknowledged
// write. A standby silent past standbyGoneAfter is gone: the takeover goes on from the
// bucket, and the writes only the two boxes held are lost.
func TestTakeoverWaitsForARestartingStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	f := newStandbyFleet(t, "box-a", "box-b", "box-c")
	c := f.engines["box-c"]
	hosts := []string{"restarting.example.com", "gone.example.com"}
	ackedOnTheStandbyOnly(t, f, hosts)
	f.killSilentFor("box-b", 5*time.Second)
	f.kill("box-a")

	restarting, gone := hosts[0], hosts[1]
	if _, err := c.Acquire(ctx, Space{Host: restarting, Kind: "app"}); !errors.Is(err, ErrStandbySilent) {
		t.Fatalf("a takeover with the standby silent for 5 s: %v, want ErrStandbySilent", err)
	}
	f.link.mu.Lock()
	f.link.silent["box-b"] = standbyGoneAfter + time.Second
	f.link.mu.Unlock()
	if n := rowsOn(t, c, gone); n != 1 {
		t.Fatalf("a takeover with the standby gone: %d rows, want the bucket log's 1", n)
	}
	standbyBackWithEveryRow(t, f, c, restarting)
}

// TestTakeoverWaitsForAStandbyThatLeft: as TestTakeoverWaitsForARestartingStandby, with
// the standby stopped cleanly (a restart's SIGTERM: its heartbeat deleted, its spool kept)
// while its holder, cut off from the bucket, acknowledged writes on its word, and the
// holder dead next. The takeover waits a minute from when it first found the standby so,
// and takes the stream once it is back; past the minute it goes on from the bucket. (The
// 30-minute campaign on a5bce9b lost six writes so: the takeover counted a standby with
// no heartbeat gone at once.)
func TestTakeoverWaitsForAStandbyThatLeft(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	f := newStandbyFleet(t, "box-a", "box-b", "box-c")
	c := f.engines["box-c"]
	hosts := []string{"back.example.com", "gone.example.com"}
	ackedOnTheStandbyOnly(t, f, hosts)
	// Leaving, box-b asks box-a to release it; box-a, cut off, cannot prove the stream in
	// the bucket and leaves the record as it is.
	a := f.engines["box-a"]
	for _, host := range hosts {
		d := a.get(host).durableOf()
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err := a.ReleaseStandby(rctx, host, "box-b", d.sb.cur.Load().gen, d.claim)
		cancel()
		if err == nil {
			t.Fatalf("%s: the holder, cut off from the bucket, released its standby", host)
		}
		if rec, _, err := spacestore.ReadStandbyRecord(ctx, f.buckets["box-c"], host); err != nil || rec == nil || rec.GivenUp {
			t.Fatalf("%s: the record after a release that failed: %+v %v, want it unmarked", host, rec, err)
		}
	}
	f.leave("box-b")
	f.kill("box-a")

	back, gone := hosts[0], hosts[1]
	for i := range 2 {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond) // past the wake's backoff: another look
		}
		_, err := c.Acquire(ctx, Space{Host: back, Kind: "app"})
		if !errors.Is(err, ErrStandbySilent) {
			t.Fatalf("takeover %d with the standby gone from the mesh: %v, want ErrStandbySilent", i+1, err)
		}
	}
	// A minute since the taker first found box-b without a heartbeat.
	c.absent.mu.Lock()
	c.absent.first["box-b"] = c.absent.first["box-b"].Add(-standbyGoneAfter)
	c.absent.mu.Unlock()
	if n := rowsOn(t, c, gone); n != 1 {
		t.Fatalf("a takeover with the standby gone for a minute: %d rows, want the bucket log's 1", n)
	}
	c.absent.mu.Lock()
	c.absent.first["box-b"] = time.Now() // and another look at back's, a moment after it left
	c.absent.mu.Unlock()
	standbyBackWithEveryRow(t, f, c, back)
}

// standbyBackWithEveryRow restarts box-b and waits for c's takeover of host (past the
// space's wake backoff, 1 s), which must have the 11 rows ackedOnTheStandbyOnly
// acknowledged.
func standbyBackWithEveryRow(t *testing.T, f *standbyFleet, c *Engine, host string) {
	t.Helper()
	f.restart("box-b")
	testwait.WaitFor(t, 10*time.Second, "the takeover, once the standby is back", func() bool {
		u, err := c.Acquire(context.Background(), Space{Host: host, Kind: "app"})
		if err == nil {
			u.Release()
		}
		return err == nil
	})
	if n := rowsOn(t, c, host); n != 11 {
		t.Fatalf("after the standby's return the taker has %d of the 11 acknowledged rows", n)
	}
}

// TestTakeoverDoesNotWaitForAReleasedStandby: the standby leaves the fleet cleanly (a
// drain, a restart) and first asks its holder to release it (ReleaseStandby): the holder
// gives the stream up, proves it in the bucket and marks the record given up before it
// answers, and answers later writes on bucket proofs. When the holder dies next, a
// takeover that finds the standby gone from the mesh goes on at once with every
// acknowledged write. A release of a stream the holder does not hold changes nothing.
func TestTakeoverDoesNotWaitForAReleasedStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	const host = "released.example.com"
	f := newStandbyFleet(t, "box-a", "box-b", "box-c")
	a, c := f.engines["box-a"], f.engines["box-c"]
	sp := wake(t, a, host)
	sp.acknowledged(createM, insertM("on the word of the standby"))
	d := a.get(host).durableOf()
	st := d.sb.cur.Load()
	if st.box != "box-b" || !st.recorded.Load() {
		t.Fatalf("the stream: box %q, recorded %v; want a recorded stream to box-b", st.box, st.recorded.Load())
	}
	for _, bad := range []struct {
		host, box string
		gen       int64
		claim     spacestore.Claim
	}{
		{"nowhere.example.com", "box-b", st.gen, d.claim},
		{host, "box-c", st.gen, d.claim},
		{host, "box-b", st.gen + 1, d.claim},
		{host, "box-b", st.gen, spacestore.Claim{Holder: "box-a", Incarnation: "0", Lease: "other"}},
	} {
		if err := a.ReleaseStandby(ctx, bad.host, bad.box, bad.gen, bad.claim); !errors.Is(err, standby.ErrNotCurrent) {
			t.Fatalf("release of %+v: %v, want ErrNotCurrent", bad, err)
		}
	}
	if st.broken.Load() {
		t.Fatal("a release of another stream broke the holder's")
	}
	if err := a.ReleaseStandby(ctx, host, "box-b", st.gen, d.claim); err != nil {
		t.Fatalf("release: %v", err)
	}
	rec, _, err := spacestore.ReadStandbyRecord(ctx, f.buckets["box-c"], host)
	if err != nil || rec == nil || rec.Box != "box-b" || !rec.GivenUp {
		t.Fatalf("the record once the release returned: %+v %v, want box-b given up", rec, err)
	}
	if err := a.ReleaseStandby(ctx, host, "box-b", st.gen, d.claim); err != nil {
		t.Fatalf("a release again: %v", err)
	}
	puts := f.link.puts.Load()
	for i := range 5 {
		sp.acknowledged(insertM(fmt.Sprint("on bucket proofs ", i)))
	}
	if n := f.link.puts.Load() - puts; n != 0 {
		t.Fatalf("%d segments sent to the released standby", n)
	}
	f.leave("box-b")
	f.kill("box-a")
	takenOverAtOnce(t, c, host, "the standby released", 6)
}

// takenOverAtOnce has c take host over, which must succeed at the first try (with names
// the standby's state) and hold rows acknowledged rows.
func takenOverAtOnce(t *testing.T, c *Engine, host, with string, rows int) {
	t.Helper()
	u, err := c.Acquire(context.Background(), Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatalf("a takeover with %s: %v", with, err)
	}
	u.Release()
	if n := rowsOn(t, c, host); n != rows {
		t.Fatalf("the taker has %d of the %d acknowledged rows", n, rows)
	}
}

// TestTakeoverDoesNotWaitForAStandbyGivenUp: the holder's standby dies, and the holder
// proves its next writes in the bucket; once a proof landed after the break, the holder
// marks the standby record given up, so when the holder dies too (the standby's heartbeat
// still young, as in TestTakeoverWaitsForARestartingStandby) the takeover does not wait
// for the standby: the bucket log holds every acknowledged write.
func TestTakeoverDoesNotWaitForAStandbyGivenUp(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	const host = "givenup.example.com"
	f := newStandbyFleet(t, "box-a", "box-b", "box-c")
	a, c := f.engines["box-a"], f.engines["box-c"]
	sp := wake(t, a, host)
	sp.acknowledged(createM, insertM("on the word of the standby"))
	if st := logStatusOf(t, a, host); st.Standby == nil || st.Standby.Box != "box-b" {
		t.Fatalf("status %+v, want a stream to box-b", st.Standby)
	}
	f.killSilentFor("box-b", 5*time.Second)
	for i := range 5 {
		sp.acknowledged(insertM(fmt.Sprint("on bucket proofs ", i)))
	}
	testwait.WaitFor(t, 10*time.Second, "the standby record marked given up", func() bool {
		rec, _, err := spacestore.ReadStandbyRecord(ctx, f.buckets["box-c"], host)
		return err == nil && rec != nil && rec.Box == "box-b" && rec.GivenUp
	})
	f.kill("box-a")
	takenOverAtOnce(t, c, host, "the standby given up by its holder", 6)
}
