package bucket

import (
	"bytes"
	"context"
	"io"
)

// Landed reports whether the object at key holds exactly one of bodies, which one, and
// the object's ETag: then that write landed, whatever answer its writer saw.
//
// A conditional write can be applied by the store and its answer lost (a timeout after
// the commit, a cut connection). Retried, by the SDK or by its caller, it then fails its
// own condition, which read naively says "another writer won": a manifest fence that
// kills a healthy instance, a lease reported lost, a ledger block skipped, a lock waited
// out for a whole TTL. Every caller's body is unique to that one write (a timestamp and
// generation, a random nonce or hold), so finding exactly those bytes at key means that
// write, and no other writer's, is what the store holds. bodies are the writes whose
// outcome the caller does not know; at most one of them can have landed when they share
// one condition.
//
// A read that fails, a missing key, or other bytes all report false: the caller then
// treats the write as lost, which is what it would have done without asking.
func Landed(ctx context.Context, b Bucket, key string, bodies ...[]byte) (etag string, which int, ok bool) {
	if len(bodies) == 0 {
		return "", 0, false // no write is in doubt: nothing to read
	}
	longest := 0
	for _, body := range bodies {
		longest = max(longest, len(body))
	}
	obj, err := b.Get(ctx, key)
	if err != nil {
		return "", 0, false
	}
	defer obj.Body.Close()
	// One byte past the longest body is enough to tell a longer object from all of them.
	cur, err := io.ReadAll(io.LimitReader(obj.Body, int64(longest)+1))
	if err != nil {
		return "", 0, false
	}
	for i, body := range bodies {
		if bytes.Equal(cur, body) {
			return obj.ETag, i, true
		}
	}
	return "", 0, false
}
