package standby

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/lchat/lchat-caddy/spacestore"
)

// The wire between a holder and its standby, mounted by the Caddy glue behind the mesh
// token under PathPrefix on the standby's SELF site:
//
//	POST PathPrefix+{host}+"/segment"  body: BucketBefore (8 bytes, big-endian), then the
//	                                   segment (spacestore.EncodeSegment's bytes). 204 once
//	                                   on disk; 400 malformed, 409 gap, stale or conflict,
//	                                   410 sealed, 413 past MaxSegmentBytes (kind "full"),
//	                                   507 full.
//	POST PathPrefix+{host}+"/stream"   the segments of host over one connection (stream.go).
//	POST PathPrefix+{host}+"/seal"     body: {"gen": n, "claim": {spacestore.Claim}}.
//	                                   200 with the entries (encodeEntries).
//	GET  PathStatus                    the spool's Status as JSON.
//
// Every error answer names its kind in ErrorHeader (the sentinel's name: "gap", "stale",
// "sealed", ...) and says what happened in a plain-text body; the Client maps the kind back
// to the sentinel, so errors.Is works across the wire.

// Paths of the standby endpoints.
const (
	PathPrefix = "/api/mesh/standby/"
	PathStatus = PathPrefix + "status"
)

// ErrorHeader carries an error answer's kind.
const ErrorHeader = "X-Lchat-Standby-Error"

// ErrNotStandbyPath is ServePeer's answer for a request outside PathPrefix: it wrote
// nothing, and the caller passes the request on.
var ErrNotStandbyPath = errors.New("not a standby endpoint")

// maxSealRequestBytes bounds a seal request's JSON body.
const maxSealRequestBytes = 64 << 10

// kinds names each sentinel on the wire, with the status it is answered with.
var kinds = []struct {
	err    error
	name   string
	status int
}{
	{ErrMalformed, "malformed", http.StatusBadRequest},
	{ErrGap, "gap", http.StatusConflict},
	{ErrStale, "stale", http.StatusConflict},
	{ErrConflict, "conflict", http.StatusConflict},
	{ErrSealed, "sealed", http.StatusGone},
	{ErrFull, "full", http.StatusInsufficientStorage},
	{ErrClosed, "closed", http.StatusServiceUnavailable},
	{ErrNotCurrent, "not_current", http.StatusConflict},
}

// ServePeer serves the standby endpoints (the glue has checked the mesh token). It writes
// every answer itself, error answers included, and returns nil; only for a path outside
// PathPrefix does it write nothing and return ErrNotStandbyPath, so the caller may pass the
// request on. A refused or malformed request stores nothing.
func (s *Spool) ServePeer(w http.ResponseWriter, r *http.Request) error {
	rest, ok := strings.CutPrefix(r.URL.Path, PathPrefix)
	if !ok {
		return ErrNotStandbyPath
	}
	if rest == "status" {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeMethodNotAllowed(w, "GET")
			return nil
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s.Status())
		return nil
	}
	host, op, ok := strings.Cut(rest, "/")
	if !ok || (op != "segment" && op != "stream" && op != "seal" && op != "retire") {
		writeError(w, http.StatusNotFound, "", "no standby endpoint at "+sanitize(r.URL.Path))
		return nil
	}
	if r.Method != http.MethodPost {
		writeMethodNotAllowed(w, "POST")
		return nil
	}
	if err := ValidateHost(host); err != nil {
		writeErr(w, err)
		return nil
	}
	switch op {
	case "segment":
		s.serveSegment(w, r, host)
	case "stream":
		s.serveStream(w, r, host)
	case "seal":
		s.serveSeal(w, r, host)
	default:
		s.serveRetire(w, r, host)
	}
	return nil
}

// serveRetire drops host's stream of the (gen, claim) in the body, when it is the current
// one (Retire): answered 204 either way.
func (s *Spool) serveRetire(w http.ResponseWriter, r *http.Request, host string) {
	var req sealRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxSealRequestBytes))
	if err := dec.Decode(&req); err != nil || dec.More() || req.Claim == nil {
		writeError(w, http.StatusBadRequest, "malformed", "a retire body is JSON {\"gen\": n, \"claim\": {...}}")
		return
	}
	retire := s.Retire
	if req.Handover {
		retire = s.Handover
	}
	if err := retire(host, req.Gen, *req.Claim); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Spool) serveSegment(w http.ResponseWriter, r *http.Request, host string) {
	limit := s.maxSegmentBytes() + 8
	if r.ContentLength > limit {
		writeError(w, http.StatusRequestEntityTooLarge, "full", fmt.Sprintf("segment body of %d bytes, more than %d", r.ContentLength, limit))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "malformed", "reading the segment body: "+err.Error())
		return
	}
	if int64(len(body)) > limit {
		writeError(w, http.StatusRequestEntityTooLarge, "full", fmt.Sprintf("segment body of more than %d bytes", limit))
		return
	}
	e, err := ParseSegmentBody(body)
	if err == nil {
		err = s.Put(host, e)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// sealRequest is a seal's JSON body.
type sealRequest struct {
	Gen   int64             `json:"gen"`
	Claim *spacestore.Claim `json:"claim"`
	// Handover, on a retire: the space slept on its holder's drain (Spool.Handover).
	Handover bool `json:"handover,omitempty"`
}

func (s *Spool) serveSeal(w http.ResponseWriter, r *http.Request, host string) {
	var req sealRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxSealRequestBytes))
	if err := dec.Decode(&req); err != nil || dec.More() {
		writeError(w, http.StatusBadRequest, "malformed", `a seal body is one JSON object {"gen": n, "claim": {...}} of at most 64 KiB`)
		return
	}
	if req.Claim == nil || req.Gen < 0 {
		writeError(w, http.StatusBadRequest, "malformed", "a seal names a claim and a generation >= 0")
		return
	}
	ents, err := s.Seal(host, req.Gen, *req.Claim)
	if err != nil {
		writeErr(w, err)
		return
	}
	body := EncodeEntries(ents)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// ParseSegmentBody splits a segment request's body into its entry: BucketBefore (8 bytes,
// big-endian, not negative) and the segment. The segment itself is checked by Put.
func ParseSegmentBody(b []byte) (Entry, error) {
	if len(b) < 8 {
		return Entry{}, fmt.Errorf("%w: a segment body starts with 8 bytes of BucketBefore; it has %d bytes", ErrMalformed, len(b))
	}
	bb := int64(binary.BigEndian.Uint64(b))
	if bb < 0 {
		return Entry{}, fmt.Errorf("%w: negative BucketBefore", ErrMalformed)
	}
	return Entry{BucketBefore: bb, Data: b[8:]}, nil
}

// EncodeEntries encodes a seal's answer: count:4, then per entry BucketBefore:8, length:4
// and the data (big-endian).
func EncodeEntries(ents []Entry) []byte {
	n := 4
	for _, e := range ents {
		n += int(entrySize(e))
	}
	b := make([]byte, 0, n)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ents)))
	for _, e := range ents {
		b = binary.BigEndian.AppendUint64(b, uint64(e.BucketBefore))
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.Data)))
		b = append(b, e.Data...)
	}
	return b
}

// DecodeEntries decodes a seal's answer (EncodeEntries): every length within the data, no
// trailing bytes, no negative BucketBefore; nothing is allocated for entries the data
// cannot hold. The segments themselves are checked by CheckSealed.
func DecodeEntries(b []byte) ([]Entry, error) {
	if len(b) < 4 {
		return nil, errors.New("decoding sealed entries: shorter than its count")
	}
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(len(b)/12) {
		return nil, fmt.Errorf("decoding sealed entries: %d entries in %d bytes", n, len(b))
	}
	ents := make([]Entry, 0, n)
	for i := uint32(0); i < n; i++ {
		if len(b) < 12 {
			return nil, fmt.Errorf("decoding sealed entries: entry %d cut short", i+1)
		}
		bb := int64(binary.BigEndian.Uint64(b))
		size := binary.BigEndian.Uint32(b[8:])
		b = b[12:]
		if bb < 0 {
			return nil, fmt.Errorf("decoding sealed entries: entry %d has a negative BucketBefore", i+1)
		}
		if uint64(size) > uint64(len(b)) {
			return nil, fmt.Errorf("decoding sealed entries: entry %d of %d bytes, %d left", i+1, size, len(b))
		}
		ents = append(ents, Entry{BucketBefore: bb, Data: b[:size:size]})
		b = b[size:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("decoding sealed entries: %d bytes after the last entry", len(b))
	}
	return ents, nil
}

// CheckSealed checks what a seal of (gen, claim) answered: each entry a data segment that
// decodes (spacestore.DecodeSegment), of gen and claim, at seq 1, 2, 3, ... A takeover
// applies these, so a standby's answer is checked as the bucket's log is.
func CheckSealed(ents []Entry, gen int64, claim spacestore.Claim) error {
	for i, e := range ents {
		seg, err := spacestore.DecodeSegment(e.Data)
		if err != nil {
			return fmt.Errorf("sealed entry %d: %w", i+1, err)
		}
		if seg.Seal || seg.Gen != gen || !sameClaim(seg.Claim, claim) || seg.Seq != int64(i)+1 {
			return fmt.Errorf("sealed entry %d is segment %d of generation %d by %q, not seq %d of the sealed stream", i+1, seg.Seq, seg.Gen, seg.Claim.Holder, i+1)
		}
	}
	return nil
}

func writeMethodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, "", "method not allowed; use "+allow)
}

// writeErr answers err with the status and kind of its sentinel (500 for none).
func writeErr(w http.ResponseWriter, err error) {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			writeError(w, k.status, k.name, err.Error())
			return
		}
	}
	writeError(w, http.StatusInternalServerError, "", err.Error())
}

func writeError(w http.ResponseWriter, status int, kind, msg string) {
	if kind != "" {
		w.Header().Set(ErrorHeader, kind)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	io.WriteString(w, msg+"\n")
}

// Client speaks to a standby's spool over the wire.
type Client struct {
	// Token is the mesh token, sent as a bearer token; never part of an error.
	Token string
	// HTTP is the client to use; nil means http.DefaultClient.
	HTTP *http.Client
	// MaxSealBytes bounds a seal's answer; it must be at least the standby's MaxHostBytes
	// + 4. Default DefaultMaxHostBytes + 4.
	MaxSealBytes int64

	// The streams kept for Put (stream.go), under streamMu.
	streamMu  sync.Mutex
	streams   map[string][]*streamConn // idle, by streamKey
	streamOff map[string]time.Time     // standbys that offer no stream: until when not asked
	swept     time.Time                // when the idle streams were last closed
	closed    bool
}

// maxErrorBody bounds what the client reads of an error answer.
const maxErrorBody = 1 << 10

// Put sends e to the standby at baseURL (its SELF URL) for host and returns once the
// standby has it on disk. Errors: ErrSealed, ErrStale, ErrGap, ErrConflict, ErrFull,
// ErrMalformed (wrapped; errors.Is) as Spool.Put returns them, carried by the answer; any
// other error (a cut connection, a timeout, a 5xx) may or may not have stored the entry:
// send it again (an idempotent retry) before acknowledging anything it carries.
//
// The segments of a host go over a connection Put keeps for the next (the stream:
// stream.go), or one request each to a standby that does not offer one.
func (c *Client) Put(ctx context.Context, baseURL, host string, e Entry) error {
	if err := ValidateHost(host); err != nil {
		return err
	}
	if e.BucketBefore < 0 {
		return fmt.Errorf("%w: negative BucketBefore", ErrMalformed)
	}
	if err := c.putStream(ctx, baseURL, host, e); !errors.Is(err, errNoStream) {
		return err
	}
	head := binary.BigEndian.AppendUint64(nil, uint64(e.BucketBefore))
	// net.Buffers writes itself out without the 32 KiB buffer io.Copy would allocate.
	newBody := func() io.Reader { return &net.Buffers{head, e.Data} }
	resp, err := c.do(ctx, baseURL, host, "segment", "application/octet-stream", int64(8+len(e.Data)), newBody)
	if err != nil {
		return err
	}
	defer drainClose(resp.Body)
	if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusOK {
		return nil
	}
	return answerError(baseURL, host, "putting a segment", resp)
}

// Seal seals host's stream of (gen, claim) on the standby at baseURL and returns its
// entries, checked (CheckSealed). Errors: ErrMalformed from the standby; any other error
// means the seal may or may not be recorded there: retry (a seal retried answers the same
// entries).
func (c *Client) Seal(ctx context.Context, baseURL, host string, gen int64, claim spacestore.Claim) ([]Entry, error) {
	if err := ValidateHost(host); err != nil {
		return nil, err
	}
	body, err := json.Marshal(sealRequest{Gen: gen, Claim: &claim})
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, baseURL, host, "seal", "application/json", int64(len(body)), func() io.Reader { return bytes.NewReader(body) })
	if err != nil {
		return nil, err
	}
	defer drainClose(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, answerError(baseURL, host, "sealing", resp)
	}
	limit := c.MaxSealBytes
	if limit <= 0 {
		limit = DefaultMaxHostBytes + 4
	}
	if resp.ContentLength > limit {
		return nil, fmt.Errorf("standby %s: sealing %s: an answer of %d bytes, more than %d", redact(baseURL), host, resp.ContentLength, limit)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("standby %s: sealing %s: reading the answer: %w", redact(baseURL), host, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("standby %s: sealing %s: an answer of more than %d bytes", redact(baseURL), host, limit)
	}
	ents, err := DecodeEntries(data)
	if err == nil {
		err = CheckSealed(ents, gen, claim)
	}
	if err != nil {
		return nil, fmt.Errorf("standby %s: sealing %s: %w", redact(baseURL), host, err)
	}
	return ents, nil
}

// Retire asks the standby to drop host's stream of (gen, claim) if it is the current one
// (Spool.Retire): the holder's checkpoint after it holds what it carried.
func (c *Client) Retire(ctx context.Context, baseURL, host string, gen int64, claim spacestore.Claim, handover bool) error {
	if err := ValidateHost(host); err != nil {
		return err
	}
	return c.postJSON(ctx, "standby", baseURL, PathPrefix+host+"/retire", host, "retire", "retiring", sealRequest{Gen: gen, Claim: &claim, Handover: handover})
}

// postJSON POSTs v as JSON to path on baseURL (post) and wants 204; what names the request
// in the error of another answer.
func (c *Client) postJSON(ctx context.Context, who, baseURL, path, host, op, what string, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	resp, err := c.post(ctx, who, baseURL, path, host, op, "application/json", int64(len(body)), func() io.Reader { return bytes.NewReader(body) })
	if err != nil {
		return err
	}
	defer drainClose(resp.Body)
	if resp.StatusCode != http.StatusNoContent {
		return peerError(who, baseURL, host, what, resp)
	}
	return nil
}

// Status reads the standby's spool status.
func (c *Client) Status(ctx context.Context, baseURL string) ([]HostStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+PathStatus, nil)
	if err != nil {
		return nil, fmt.Errorf("standby %s: status: %w", redact(baseURL), err)
	}
	c.authorize(req)
	resp, err := c.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("standby %s: status: %w", redact(baseURL), err)
	}
	defer drainClose(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, answerError(baseURL, "", "reading status", resp)
	}
	var out []HostStatus
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil {
		return nil, fmt.Errorf("standby %s: status: %w", redact(baseURL), err)
	}
	return out, nil
}

func (c *Client) do(ctx context.Context, baseURL, host, op, ctype string, n int64, body func() io.Reader) (*http.Response, error) {
	return c.post(ctx, "standby", baseURL, PathPrefix+host+"/"+op, host, op, ctype, n, body)
}

// post POSTs body to path on baseURL, a peer's SELF URL; who (its role: "standby",
// "holder"), host and op name the request in errors.
func (c *Client) post(ctx context.Context, who, baseURL, path, host, op, ctype string, n int64, body func() io.Reader) (*http.Response, error) {
	u := strings.TrimRight(baseURL, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, body())
	if err != nil {
		return nil, fmt.Errorf("%s %s: %s %s: %w", who, redact(baseURL), op, host, err)
	}
	req.ContentLength = n
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body()), nil }
	req.Header.Set("Content-Type", ctype)
	c.authorize(req)
	resp, err := c.client().Do(req)
	if err != nil {
		// url.Error names the URL (its password redacted), never a header.
		return nil, fmt.Errorf("%s %s: %s %s: %w", who, redact(baseURL), op, host, err)
	}
	return resp, nil
}

func (c *Client) authorize(req *http.Request) {
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
}

func (c *Client) client() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// answerError turns an error answer into an error wrapping the sentinel its kind names.
func answerError(baseURL, host, what string, resp *http.Response) error {
	return peerError("standby", baseURL, host, what, resp)
}

// peerError is answerError for a peer in the role who.
func peerError(who, baseURL, host, what string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	msg := sanitize(string(b))
	where := who + " " + redact(baseURL)
	if host != "" {
		where += " " + host
	}
	kind := resp.Header.Get(ErrorHeader)
	for _, k := range kinds {
		if k.name == kind {
			return fmt.Errorf("%s: %s: %s: %w", where, what, msg, k.err)
		}
	}
	return fmt.Errorf("%s: %s: %s: %s", where, what, resp.Status, msg)
}

// sanitize keeps a peer's text printable and short enough for a log line.
func sanitize(s string) string {
	s = strings.TrimSpace(s)
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, s)
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// redact drops any userinfo of a base URL for errors.
func redact(baseURL string) string {
	u, err := url.Parse(baseURL)
	if err != nil {
		return "(unparseable URL)"
	}
	u.User = nil
	return u.String()
}

func drainClose(rc io.ReadCloser) {
	io.Copy(io.Discard, io.LimitReader(rc, 64<<10))
	rc.Close()
}
