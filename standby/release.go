package standby

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/lchat/lchat-caddy/spacestore"
)

// A standby that leaves the fleet cleanly (a drain, a restart's SIGTERM) deletes its
// heartbeat, which says that it left but not when: a takeover that finds a holder's
// standby gone from the mesh cannot tell one restarting with its spool (which may hold the
// only copy of writes the holder acknowledged while cut off from the bucket) from one
// long gone, and waits for it. So before it leaves, the standby asks each holder it
// streams for to release it, on the holder's SELF site behind the mesh token:
//
//	POST PathRelease+{host}  body: {"gen": n, "claim": {spacestore.Claim}, "standby": box}.
//	                         204 once the holder gave the stream up and marked its standby
//	                         record given up (the bucket log holds what the stream carried);
//	                         409 kind "not_current" when the holder does not hold that
//	                         stream; 400 malformed; 503 when the record could not be marked
//	                         (the bucket out of reach).
//
// The holder marks nothing it cannot prove in the bucket, so a release that fails leaves
// the takeover's wait in place: it is an optimisation of a clean exit, never a promise.

// PathRelease is the holder's release endpoint's prefix.
const PathRelease = "/api/mesh/release/"

// ErrNotCurrent is a holder's answer to a release of a stream it does not hold.
var ErrNotCurrent = errors.New("not the holder's current stream")

// ReleaseRequest is a release's JSON body.
type ReleaseRequest struct {
	Gen   int64             `json:"gen"`
	Claim *spacestore.Claim `json:"claim"`
	// Standby is the leaving box's member name (its SELF URL).
	Standby string `json:"standby"`
}

// ReleaseFunc releases standby from host's stream of (gen, claim) (engine.ReleaseStandby).
type ReleaseFunc func(ctx context.Context, host, standby string, gen int64, claim spacestore.Claim) error

// ServeRelease serves a release (the glue has checked the mesh token and the path's
// prefix): it parses the request, calls release, and answers as PathRelease says.
func ServeRelease(w http.ResponseWriter, r *http.Request, release ReleaseFunc) {
	if r.Method != http.MethodPost {
		writeMethodNotAllowed(w, "POST")
		return
	}
	host := strings.TrimPrefix(r.URL.Path, PathRelease)
	if err := ValidateHost(host); err != nil {
		writeErr(w, err)
		return
	}
	var req ReleaseRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxSealRequestBytes))
	if err := dec.Decode(&req); err != nil || dec.More() || req.Claim == nil || req.Gen < 0 || req.Standby == "" {
		writeError(w, http.StatusBadRequest, "malformed",
			`a release body is one JSON object {"gen": n, "claim": {...}, "standby": "box"} of at most 64 KiB`)
		return
	}
	if err := release(r.Context(), host, req.Standby, req.Gen, *req.Claim); err != nil {
		if errors.Is(err, ErrNotCurrent) {
			writeErr(w, err)
		} else {
			writeError(w, http.StatusServiceUnavailable, "", "the standby record was not marked given up: "+err.Error())
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Release asks the holder at baseURL (its SELF URL) to release standby from host's stream
// of (gen, claim). nil once the holder marked its record given up; ErrNotCurrent (wrapped)
// when it does not hold that stream.
func (c *Client) Release(ctx context.Context, baseURL, host, standby string, gen int64, claim spacestore.Claim) error {
	if err := ValidateHost(host); err != nil {
		return err
	}
	return c.postJSON(ctx, "holder", baseURL, PathRelease+host, host, "release", "releasing", ReleaseRequest{Gen: gen, Claim: &claim, Standby: standby})
}
