package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/spacestore"
)

// BenchmarkWakeLatency measures request → ready (Acquire returns, then the first byte of a
// GET) for a sleeping space holding a SQLite database of the given size, against versitygw:
// lease, manifest read, blob download and verify, process start, readiness. 20 wakes per size
// whatever b.N; run with -benchtime=1x.
func BenchmarkWakeLatency(b *testing.B) {
	for _, size := range []int{1 << 20, 50 << 20} {
		b.Run(fmt.Sprintf("%dMB", size>>20), func(b *testing.B) {
			f := newFixture(b)
			e := f.engine("1", nil)
			sp := engine.Space{Host: "bench.test", Kind: "app"}
			ctx := context.Background()
			u := acquire(b, e, sp)
			if code, body := call(b, u, "POST", fmt.Sprintf("/fill?bytes=%d", size)); code != 200 {
				b.Fatalf("fill: %d %s", code, body)
			}
			u.Release()
			if err := e.Sleep(ctx, sp.Host); err != nil {
				b.Fatal(err)
			}
			m, _, _ := spacestore.ReadManifest(ctx, f.bucket, sp.Host)
			var dbSize int64
			for _, fl := range m.Files {
				dbSize += fl.Size
			}
			const wakes = 20
			var lat []time.Duration
			var phaseMu sync.Mutex
			var fences, totals []time.Duration // the engine's own phase figures, per wake
			defer e.Observe(func(ev engine.Event) {
				if ev.Type == engine.EventWake && ev.Err == "" {
					phaseMu.Lock()
					fences, totals = append(fences, ev.Phases.Fence), append(totals, ev.Phases.Total())
					phaseMu.Unlock()
				}
			})()
			before := e.Counters()
			b.ResetTimer()
			for range wakes {
				start := time.Now()
				u := acquire(b, e, sp)
				if code, _ := call(b, u, "GET", "/ready"); code != 200 {
					b.Fatal("not ready")
				}
				lat = append(lat, time.Since(start))
				u.Release()
				b.StopTimer()
				if err := e.Sleep(ctx, sp.Host); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			after := e.Counters()
			slices.Sort(lat)
			p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(after.BlobsUploaded-before.BlobsUploaded), "blobs-uploaded-by-sleeps")
			fmt.Printf("wake latency, %d MB SQLite space (snapshot %d bytes), %d wakes against versitygw: p50 %v  p99 %v  min %v  max %v; sleeps between wakes uploaded %d blobs, %d bytes\n",
				size>>20, dbSize, wakes, p50, p99, lat[0], lat[len(lat)-1], after.BlobsUploaded-before.BlobsUploaded, after.BytesUploaded-before.BytesUploaded)
			phaseMu.Lock()
			slices.Sort(fences)
			slices.Sort(totals)
			if n := len(fences); n > 0 {
				fmt.Printf("  of which the fence (one conditional manifest PUT): p50 %v  p99 %v, against the engine's wake p50 %v (%.1f%%)\n",
					fences[n/2], fences[n*99/100], totals[n/2], 100*float64(fences[n/2])/float64(totals[n/2]))
				b.ReportMetric(float64(fences[n/2].Microseconds())/1000, "fence-p50-ms")
			}
			phaseMu.Unlock()
		})
	}
}

// BenchmarkCheckpointUnchanged checkpoints a 50 MB space that did not change since its last
// checkpoint, against versitygw: warm (this box checkpointed it before: fingerprint cache)
// and cold (a fresh Syncer after restore elsewhere: VACUUM INTO and hashing, still no upload).
func BenchmarkCheckpointUnchanged(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	dir := b.TempDir()
	s := &spacestore.Syncer{Bucket: f.bucket, Host: "ckpt.test", DataDir: filepath.Join(dir, "data"), WorkDir: filepath.Join(dir, "work"), WrittenBy: "bench"}
	os.MkdirAll(s.DataDir, 0o700)
	fillDB(b, filepath.Join(s.DataDir, "app.db"), 50<<20)
	os.WriteFile(filepath.Join(s.DataDir, "notes.txt"), []byte("some notes"), 0o600)
	if _, err := s.Checkpoint(ctx, spacestore.Periodic, nil, time.Now()); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"warm", "cold"} {
		b.Run(mode, func(b *testing.B) {
			var blobs int
			var bytes int64
			var writes int
			for b.Loop() {
				cs := s
				if mode == "cold" {
					b.StopTimer()
					cs = &spacestore.Syncer{Bucket: f.bucket, Host: "ckpt.test", DataDir: s.DataDir, WorkDir: s.WorkDir, WrittenBy: "bench"}
					if err := cs.Load(ctx); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				st, err := cs.Checkpoint(ctx, spacestore.Periodic, nil, time.Now())
				if err != nil {
					b.Fatal(err)
				}
				blobs += st.BlobsUploaded
				bytes += st.BytesUploaded
				if st.ManifestWritten {
					writes++
				}
			}
			b.ReportMetric(float64(blobs), "blobs-uploaded")
			b.ReportMetric(float64(bytes), "bytes-uploaded")
			b.ReportMetric(float64(writes), "manifest-writes")
			fmt.Printf("checkpoint of an unchanged 50 MB space (%s), %d runs: %v/op, %d blobs uploaded, %d bytes uploaded, %d manifest writes\n",
				mode, b.N, b.Elapsed()/time.Duration(b.N), blobs, bytes, writes)
		})
	}
}

func fillDB(b *testing.B, path string, size int) {
	db := openDBAt(b, path)
	defer db.Close()
	db.Exec("CREATE TABLE fill (data BLOB)")
	buf := make([]byte, 64<<10)
	for n := size; n > 0; n -= len(buf) {
		for i := range buf {
			buf[i] = byte(i*7 + n)
		}
		if _, err := db.Exec("INSERT INTO fill (data) VALUES (?)", buf); err != nil {
			b.Fatal(err)
		}
	}
}
