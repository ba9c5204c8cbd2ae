package registry

import "errors"

// ErrInvalidRev refuses a replicated tombstone whose revision is malformed.
var ErrInvalidRev = errors.New("invalid tombstone revision")

// ApplyReplicated stores a row a peer replicated: by revision when it carries one
// (ApplyRow: ErrStale when not newer than what is held), as is when it comes from a
// box that predates revisions (PutUnversioned).
func (g *Registry) ApplyReplicated(rt Route) (Route, error) {
	if rt.Rev != "" {
		return g.ApplyRow(rt)
	}
	return g.PutUnversioned(rt)
}

// RemoveReplicated applies a peer's tombstone for host: by revision when rev is set
// (ErrInvalidRev when malformed; ApplyTombstone: ErrStale when older than what is held),
// unconditionally when it is empty (DeleteUnversioned), a host without a row being no
// error. It reports whether a row was deleted.
func (g *Registry) RemoveReplicated(host, rev string) (existed bool, err error) {
	if rev != "" {
		if !ValidRev(rev) {
			return false, ErrInvalidRev
		}
		return g.ApplyTombstone(host, rev)
	}
	err = g.DeleteUnversioned(host)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}
