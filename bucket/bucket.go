// Package bucket is the object-store layer every other part of lchat-caddy goes through:
// leases, heartbeats, checkpoints, the id ledger and certificates. A Bucket is a flat key space
// (keys are relative to the backend's configured prefix) with the conditional writes S3 offers:
// create-if-absent (If-None-Match: *) and compare-and-swap (If-Match: <etag>).
package bucket

import (
	"context"
	"errors"
	"io"
	"time"
)

// Typed errors. Backends wrap them, so test with errors.Is.
var (
	// ErrNotFound means the key does not exist.
	ErrNotFound = errors.New("object not found")
	// ErrPreconditionFailed means a conditional write lost: the key exists for an
	// If-None-Match create, or its ETag differs (or it is missing) for an If-Match write.
	ErrPreconditionFailed = errors.New("precondition failed")
	// ErrConflict means the store saw a concurrent conditional write to the same key
	// (S3 409 ConditionalRequestConflict). The write did not happen; it may be retried.
	ErrConflict = errors.New("conditional request conflict")
)

// LostRace reports whether err says a conditional write or delete lost to another
// writer: ErrPreconditionFailed (the key was not in the state the condition named) or
// ErrConflict (a concurrent conditional write to the key won). Either way the write did
// not happen, and the caller reads the key again before deciding what to do.
func LostRace(err error) bool {
	return errors.Is(err, ErrPreconditionFailed) || errors.Is(err, ErrConflict)
}

// Info describes one stored object.
type Info struct {
	Key          string    `json:"key"`
	Size         int64     `json:"size"`
	ETag         string    `json:"etag"`
	LastModified time.Time `json:"last_modified"`
}

// Object is an object's content, streamed. The caller closes Body.
type Object struct {
	Info
	Body io.ReadCloser
}

// Cond is the precondition of a write or delete. The zero value is unconditional.
type Cond struct {
	// IfNoneMatch makes a put succeed only when the key does not exist yet.
	IfNoneMatch bool
	// IfMatch makes the operation succeed only when the key's current ETag equals it.
	IfMatch string
}

// ListPage is one page of a listing.
type ListPage struct {
	Objects []Info
	// NextToken continues the listing; empty on the last page.
	NextToken string
	// Now is the store's own clock when it answered (the S3 Date header). Liveness
	// judgements compare LastModified against it, never against the local clock.
	Now time.Time
}

// Bucket is an object store. Implementations are safe for concurrent use.
type Bucket interface {
	// Get streams an object.
	Get(ctx context.Context, key string) (*Object, error)
	// Head returns an object's metadata.
	Head(ctx context.Context, key string) (Info, error)
	// Put stores body under key, streaming it. size is the body length, or -1 when unknown.
	//
	// Errors: a lost condition (cond.IfNoneMatch on an existing key, cond.IfMatch on a
	// missing key or another ETag) is ErrPreconditionFailed, and a concurrent conditional
	// write that the store refused is ErrConflict; in both the write did not happen
	// (LostRace). Any other error, a timeout or a cut connection among them, may have
	// been applied: the caller that must know reads the key back (Landed).
	Put(ctx context.Context, key string, body io.Reader, size int64, cond Cond) (Info, error)
	// Delete removes key. An unconditional delete of a missing key succeeds;
	// with cond.IfMatch set, a missing key or another ETag is ErrPreconditionFailed, and a
	// concurrent conditional write is ErrConflict (LostRace). Other errors may have been applied.
	Delete(ctx context.Context, key string, cond Cond) error
	// List returns one page of the keys under prefix, in lexical order, starting after token.
	List(ctx context.Context, prefix, token string) (ListPage, error)
	// Copy copies src to dst within the bucket.
	Copy(ctx context.Context, src, dst string) (Info, error)
	// String describes the bucket for logs (never credentials).
	String() string
}
