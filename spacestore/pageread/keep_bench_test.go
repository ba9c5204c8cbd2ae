package pageread

import (
	"context"
	"crypto/rand"
	"database/sql"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkViewUnderWriters is what opening a view of the WAL's tail costs while an
// instance's writers take turns on the write lock, as the demo space's do under load: 16
// writers, each request on a connection of the app's pool (busy_timeout 5 s, BEGIN
// IMMEDIATE), one ~300-byte row per commit, while a view of the WAL's tail is opened every
// 2 ms (a log segment's cut) and held for 200 µs. "sqlite-waits" takes the lock and leaves
// its wait to SQLite's busy handler (1, 2, 5, 10 ms sleeps), "poll" takes it with begin's
// own wait, "unlocked" reads the tail without it (follow.go; the lock only after a WAL
// restart). The lock-wait metrics are the time to open the view; the three run side by side:
//
//	go test ./spacestore/pageread -run '^$' -bench ViewUnderWriters -benchtime 400x -count 3
func BenchmarkViewUnderWriters(b *testing.B) {
	for _, mode := range []string{"sqlite-waits", "poll", "unlocked"} {
		b.Run(mode, func(b *testing.B) {
			sqliteWaits = mode == "sqlite-waits"
			lockedTails = mode != "unlocked"
			defer func() { sqliteWaits, lockedTails = false, false }()
			benchViewUnderWriters(b)
		})
	}
}

func benchViewUnderWriters(b *testing.B) {
	const writers = 16
	p := filepath.Join(b.TempDir(), "app.db")
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	app, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: p, RawQuery: q.Encode()}).String())
	if err != nil {
		b.Fatal(err)
	}
	defer app.Close()
	if _, err := app.Exec("CREATE TABLE m (id INTEGER PRIMARY KEY, at INTEGER, body BLOB); CREATE INDEX m_at ON m (at)"); err != nil {
		b.Fatal(err)
	}
	k := NewKeeper()
	defer k.Close()
	ctx := context.Background()
	var commits atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			body := make([]byte, 300)
			for {
				select {
				case <-stop:
					return
				default:
				}
				rand.Read(body)
				if _, err := app.Exec("INSERT INTO m (at, body) VALUES (?, ?)", time.Now().UnixNano(), body); err != nil {
					b.Error(err)
					return
				}
				commits.Add(1)
			}
		})
	}
	var since *WALPos
	var waits []time.Duration
	start, c0 := time.Now(), commits.Load()
	for b.Loop() {
		time.Sleep(2 * time.Millisecond)
		t0 := time.Now()
		v, err := k.OpenTail(ctx, p, since)
		if err != nil {
			b.Fatal(err)
		}
		waits = append(waits, time.Since(t0))
		if changed, err := v.ChangedSinceTail(); err != nil {
			b.Fatal(err)
		} else if err := v.ReadPages(changed, func(uint32, []byte) error { return nil }); err != nil {
			b.Fatal(err)
		}
		pos := v.Shape().Pos
		since = &pos
		for t1 := time.Now(); time.Since(t1) < 200*time.Microsecond; {
		}
		v.Close()
	}
	took, n := time.Since(start), commits.Load()-c0
	close(stop)
	wg.Wait()
	slices.Sort(waits)
	b.ReportMetric(float64(waits[len(waits)/2].Microseconds()), "lock-wait-p50-µs")
	b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "lock-wait-p99-µs")
	b.ReportMetric(float64(n)/took.Seconds(), "commits/s")
}
