// Package bucket_test benchmarks the bucket layer against its two backends side by
// side: versitygw (a real S3 server on loopback) and the file backend.
//
//	go test ./tests/bucket -run '^$' -bench . -benchtime 2s
package bucket_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

type backend struct {
	name string
	new  func(b *testing.B) bucket.Bucket
}

func backends() []backend {
	return []backend{
		{"versitygw", func(b *testing.B) bucket.Bucket { return harness.StartS3(b).NewBucket(b, "bench") }},
		{"file", func(b *testing.B) bucket.Bucket {
			fb, err := filebucket.New(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			return fb
		}},
	}
}

const smallBody = `{"holder":"https://box1.example.com","incarnation":"0192f1c2","expires":"2026-01-01T00:00:00Z"}`

func opsPerSec(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

func BenchmarkBucket(b *testing.B) {
	ctx := context.Background()
	for _, be := range backends() {
		b.Run(be.name, func(b *testing.B) {
			bkt := be.new(b)
			b.Run("SmallPut", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if _, err := bkt.Put(ctx, fmt.Sprintf("put/%d", i%100), strings.NewReader(smallBody), int64(len(smallBody)), bucket.Cond{}); err != nil {
						b.Fatal(err)
					}
				}
				opsPerSec(b)
			})
			b.Run("Get", func(b *testing.B) {
				if _, err := bkt.Put(ctx, "get", strings.NewReader(smallBody), int64(len(smallBody)), bucket.Cond{}); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					obj, err := bkt.Get(ctx, "get")
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, obj.Body)
					obj.Body.Close()
				}
				opsPerSec(b)
			})
			b.Run("List100", func(b *testing.B) {
				for i := range 100 {
					if _, err := bkt.Put(ctx, fmt.Sprintf("mesh/members/%03d", i), strings.NewReader(smallBody), int64(len(smallBody)), bucket.Cond{}); err != nil {
						b.Fatal(err)
					}
				}
				for b.Loop() {
					page, err := bkt.List(ctx, "mesh/members/", "")
					if err != nil || len(page.Objects) != 100 {
						b.Fatalf("list: %v, %d objects", err, len(page.Objects))
					}
				}
				opsPerSec(b)
			})
			b.Run("CondCreate", func(b *testing.B) {
				var n atomic.Int64
				for b.Loop() {
					key := fmt.Sprintf("lease/%d", n.Add(1))
					if _, err := bkt.Put(ctx, key, strings.NewReader(smallBody), int64(len(smallBody)), bucket.Cond{IfNoneMatch: true}); err != nil {
						b.Fatal(err)
					}
				}
				opsPerSec(b)
			})
			b.Run("CondSwap", func(b *testing.B) {
				info, err := bkt.Put(ctx, "manifest", strings.NewReader("gen0"), 4, bucket.Cond{})
				if err != nil {
					b.Fatal(err)
				}
				for i := 0; b.Loop(); i++ {
					body := fmt.Sprintf("gen%d", i+1)
					if info, err = bkt.Put(ctx, "manifest", strings.NewReader(body), int64(len(body)), bucket.Cond{IfMatch: info.ETag}); err != nil {
						b.Fatal(err)
					}
				}
				opsPerSec(b)
			})
		})
	}
}
