package filebucket_test

import (
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/buckettest"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

func TestConformance(t *testing.T) {
	buckettest.Run(t, func(t *testing.T) bucket.Bucket {
		b, err := filebucket.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

func TestConformanceWithPrefix(t *testing.T) {
	buckettest.Run(t, func(t *testing.T) bucket.Bucket {
		root, err := filebucket.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		// Another prefix's keys in the same root must stay invisible.
		other, err := root.Sub("other")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Put(t.Context(), "p/0001", strings.NewReader("x"), 1, bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
		b, err := root.Sub("/lchat/prod/")
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
