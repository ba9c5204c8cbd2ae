package mesh

import "testing"

func TestSameBucket(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"s3://x/p", "s3://x/p", true},
		{"s3://x/p", "s3://x/p at http://127.0.0.1:9000", true}, // endpoint from the env on one side
		{"s3://x/p at http://a:1", "s3://x/p at http://b:1", false},
		{"s3://x/ie", "s3://x/fi", false},
		{"s3://x", "s3://y", false},
	} {
		if got := SameBucket(tc.a, tc.b); got != tc.same {
			t.Errorf("SameBucket(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}
