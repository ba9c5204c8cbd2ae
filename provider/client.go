package provider

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/mesh"
)

// Conn is this fleet's connection to one provider: the transport of its forwarded
// requests (RoundTrip) and of its API calls (client.go's methods), with the provider's
// certificate verified against its base URL's host (there is no way to skip that), every
// bound of an untrusted upstream, and its health.
type Conn struct {
	P *Provider
	// Observe, when set, hears every forwarded request's outcome (the glue's metrics).
	Observe func(provider string, d time.Duration, failed bool)
	// Answered, when set, hears the host of each forwarded request that the provider
	// answered with a status below 500, or, a reopen (connhold.ReopenHeader: a held
	// event stream's, a pull), with a 2xx: the space is awake there, since a request
	// wakes it and a reopen is served only while it is awake, and the provider announces
	// its wakes no other way. It is called before the answer is passed on, and must not
	// block.
	Answered func(host string)

	base   *url.URL
	tr     *http.Transport
	opts   ConnOptions
	health Health
}

// ConnOptions bound a provider's answers. Zero fields take the defaults.
type ConnOptions struct {
	// Roots are the roots its certificate must chain to. Default: the system's.
	Roots *x509.CertPool
	// DialTimeout bounds the dial and the TLS handshake. Default 5s.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a forwarded request's answer headers (a
	// wake on the provider's side included). Default 2m.
	ResponseHeaderTimeout time.Duration
	// CallTimeout bounds an API call, except the streams of a state. Default 1m.
	CallTimeout time.Duration
	// MaxResponseBytes bounds the body of a forwarded answer (an event stream and an
	// upgraded connection excepted): past it the answer is cut. Default 256 MiB.
	MaxResponseBytes int64
	// MaxHeaderBytes bounds its answer headers. Default 64 KiB.
	MaxHeaderBytes int64
}

func (o ConnOptions) withDefaults() ConnOptions {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.ResponseHeaderTimeout <= 0 {
		o.ResponseHeaderTimeout = 2 * time.Minute
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = time.Minute
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = 256 << 20
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = 64 << 10
	}
	return o
}

// DialError is a failure to reach the provider before anything was sent: whatever the
// request asked, the provider did not do it.
type DialError struct{ Err error }

// Unsent reports whether err is a DialError: the request never reached the provider.
func Unsent(err error) bool {
	var de DialError
	return errors.As(err, &de)
}

func (e DialError) Error() string { return e.Err.Error() }
func (e DialError) Unwrap() error { return e.Err }

// NewConn is the connection to p. wrap, when set, wraps a dial failure inside its
// DialError (the glue makes it Caddy's reverse proxy's own), so that errors.As finds
// both.
func NewConn(p *Provider, opts ConnOptions, wrap func(error) error) (*Conn, error) {
	u, err := url.Parse(p.URL)
	if err != nil || ValidBaseURL(p.URL) != nil {
		return nil, fmt.Errorf("provider %s: bad url", p.Name)
	}
	opts = opts.withDefaults()
	c := &Conn{P: p, base: u, opts: opts}
	dialErr := func(err error) error {
		if wrap != nil {
			err = wrap(err)
		}
		return DialError{err}
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "443")
	}
	dialer := &net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second}
	c.tr = &http.Transport{
		Proxy: nil,
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, dialErr(err)
			}
			tc := tls.Client(conn, &tls.Config{
				ServerName: u.Hostname(),
				RootCAs:    opts.Roots,
				MinVersion: tls.VersionTLS12,
				NextProtos: []string{"http/1.1"},
			})
			hctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				conn.Close()
				err = fmt.Errorf("TLS handshake with provider %s: %w", p.Name, err)
				var bad *tls.CertificateVerificationError
				if errors.As(err, &bad) {
					return nil, err
				}
				return nil, dialErr(err)
			}
			return tc, nil
		},
		MaxIdleConns:           256,
		MaxIdleConnsPerHost:    64,
		IdleConnTimeout:        90 * time.Second,
		ResponseHeaderTimeout:  opts.ResponseHeaderTimeout,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: opts.MaxHeaderBytes,
	}
	return c, nil
}

// Close drops the idle connections.
func (c *Conn) Close() { c.tr.CloseIdleConnections() }

// Health is what this box has seen of a provider lately.
type Health struct {
	requests, errors atomic.Uint64
	// failing counts the consecutive forwards or calls that got no answer.
	failing atomic.Int64
	lastErr atomic.Pointer[string]
}

// A provider's health as this box has seen it (HealthReport.Health).
const (
	// HealthUnknown: no request to it has finished on this box yet (since its
	// connection was configured): nothing says whether it answers.
	HealthUnknown = "unknown"
	// HealthHealthy: the last request to it got an answer.
	HealthHealthy = "healthy"
	// HealthFailing: the last request to it got no answer (LastError says how).
	HealthFailing = "failing"
)

// HealthReport is Health as status shows it.
type HealthReport struct {
	// Health is HealthUnknown, HealthHealthy or HealthFailing.
	Health string `json:"health"`
	// Healthy is Health == HealthHealthy: false before any request finished.
	Healthy  bool   `json:"healthy"`
	Requests uint64 `json:"requests"`
	Errors   uint64 `json:"errors"`
	// LastError is this box's own description of the last failure (never the
	// provider's words).
	LastError string `json:"last_error,omitempty"`
}

// Health reports what this box has seen of the provider.
func (c *Conn) Health() HealthReport {
	h := &c.health
	// failing before requests: note moves failing first, so a request counted is
	// never read as healthy before its failure is.
	failing := h.failing.Load()
	r := HealthReport{Health: HealthHealthy, Requests: h.requests.Load(), Errors: h.errors.Load()}
	switch {
	case failing > 0:
		r.Health = HealthFailing
	case r.Requests == 0:
		r.Health = HealthUnknown
	}
	r.Healthy = r.Health == HealthHealthy
	if e := h.lastErr.Load(); e != nil {
		r.LastError = *e
	}
	return r
}

func (c *Conn) note(start time.Time, err error) {
	h := &c.health
	if err != nil {
		msg := failureOf(err)
		h.lastErr.Store(&msg)
		h.failing.Add(1)
		h.errors.Add(1)
	} else {
		h.failing.Store(0)
	}
	h.requests.Add(1)
	if c.Observe != nil {
		c.Observe(c.P.Name, time.Since(start), err != nil)
	}
}

// failureOf names a failure by its kind, in this box's words.
func failureOf(err error) string {
	var ne net.Error
	switch {
	case Unsent(err):
		return "unreachable"
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.Is(err, errTooLarge):
		return "answer too large"
	case errors.As(err, new(*WireError)):
		return "held-connection wire version mismatch"
	}
	return "no answer"
}

// RoundTrip forwards a request of a delegated space to the provider: the Host kept, the
// hop marked (Mark), headers of the mesh and of tests never sent, a request of the
// held-connection wire versioned (WireHeader), and the answer bounded (headers, body)
// with no X-Lchat- header of the provider's let through. An answer to a held-connection
// request that names another version, or that would act on the held connections (a 2xx,
// a 409 asking for a replay) without WireVersion, is a *WireError, its body unread.
func (c *Conn) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	host := mesh.NormalizeHost(req.Host)
	dropLchatHeaders(req.Header)
	c.P.Mark(req.Header, host, time.Now())
	held := HeldRequest(req)
	if held {
		req.Header.Set(WireHeader, WireVersion)
	} else {
		req.Header.Del(WireHeader)
	}
	req.URL.Scheme, req.URL.Host = "https", c.base.Host
	resp, err := c.tr.RoundTrip(req)
	if err != nil {
		c.note(start, err)
		return nil, err
	}
	dropLchatHeaders(resp.Header)
	dropLchatHeaders(resp.Trailer)
	got := resp.Header.Get(WireHeader)
	resp.Header.Del(WireHeader)
	if held && got != WireVersion && (got != "" || resp.StatusCode/100 == 2 ||
		resp.StatusCode == http.StatusConflict && resp.Header.Get(connhold.ReplayHeader) != "") {
		resp.Body.Close()
		err := &WireError{Of: "the provider's answer", Got: got}
		c.note(start, err)
		return nil, err
	}
	if c.Answered != nil && awake(req, resp) {
		c.Answered(host)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = &limitedBody{ReadCloser: resp.Body, left: c.opts.MaxResponseBytes, done: func(err error) { c.note(start, err) }}
		return resp, nil
	}
	c.note(start, nil)
	return resp, nil
}

// awake reports whether resp, the provider's answer to req, says the space is awake
// there (Conn.Answered).
func awake(req *http.Request, resp *http.Response) bool {
	if req.Header.Get(connhold.ReopenHeader) != "" {
		return resp.StatusCode/100 == 2
	}
	return resp.StatusCode < http.StatusInternalServerError
}

// dropLchatHeaders removes every X-Lchat- header (the mesh's, the tests'): none crosses
// the hop to a provider, and none of a provider's is honoured.
func dropLchatHeaders(h http.Header) {
	for k := range h {
		if len(k) >= 8 && strings.EqualFold(k[:8], "X-Lchat-") {
			delete(h, k)
		}
	}
}

var errTooLarge = errors.New("provider answer larger than max_response_bytes")

// limitedBody cuts an answer past its bound (the client sees the answer cut) and tells
// done how it ended.
type limitedBody struct {
	io.ReadCloser
	left int64
	done func(error)
	fin  bool
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		b.finish(errTooLarge)
		return 0, errTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		b.finish(errTooLarge)
		return n + int(b.left), errTooLarge
	}
	switch {
	case err == io.EOF:
		b.finish(nil)
	case err != nil:
		b.finish(err)
	}
	return n, err
}

func (b *limitedBody) Close() error {
	b.finish(nil)
	return b.ReadCloser.Close()
}

func (b *limitedBody) finish(err error) {
	if !b.fin {
		b.fin = true
		b.done(err)
	}
}

// APIError is a provider's refusal of an API call: its status, and its message, cut to a
// line of printable text (it is untrusted input).
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("provider answered %d: %s", e.Status, e.Message)
}

// NotFound reports whether err is the provider's 404: no such space hosted for this fleet.
func NotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// maxAnswer bounds an API call's JSON answer.
const maxAnswer = 64 << 10

// call makes one API call: body (may be nil) sent with contentType, the answer's 2xx
// body handed to read (nil: drained) or decoded into an *APIError.
func (c *Conn) call(ctx context.Context, method, host, op string, body io.Reader, contentType string, read func(io.Reader) error) error {
	start := time.Now()
	p := PathSpaces + host
	if op != "" {
		p += "/" + op
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.Scheme+"://"+c.base.Host+p, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+string(c.P.Token))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.tr.RoundTrip(req)
	if err != nil {
		c.note(start, err)
		return fmt.Errorf("provider %s: %w", c.P.Name, err)
	}
	defer resp.Body.Close()
	c.note(start, nil)
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(&e)
		return &APIError{Status: resp.StatusCode, Message: untrustedLine(e.Error)}
	}
	if read == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswer))
		return nil
	}
	return read(resp.Body)
}

// untrustedLine is s cut to 200 printable characters.
func untrustedLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, s)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" {
		s = "(no message)"
	}
	return s
}

func (c *Conn) callJSON(ctx context.Context, method, host, op string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
	defer cancel()
	var body io.Reader
	ct := ""
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = strings.NewReader(string(raw)), "application/json"
	}
	return c.call(ctx, method, host, op, body, ct, func(r io.Reader) error {
		if out == nil {
			return nil
		}
		if err := json.NewDecoder(io.LimitReader(r, maxAnswer)).Decode(out); err != nil {
			return fmt.Errorf("provider %s: an answer that is not the API's JSON", c.P.Name)
		}
		return nil
	})
}

// Status is the provider's status of host (404: not hosted for this fleet: NotFound).
func (c *Conn) Status(ctx context.Context, host string) (Status, error) {
	var s Status
	err := c.callJSON(ctx, http.MethodGet, host, OpSpace, nil, &s)
	return s, err
}

// Host asks the provider to host host (PUT of the space).
func (c *Conn) Host(ctx context.Context, host string, req CreateRequest) (Status, error) {
	var s Status
	err := c.callJSON(ctx, http.MethodPut, host, OpSpace, req, &s)
	return s, err
}

// Hibernate asks the provider to put host to sleep everywhere and hold it asleep.
func (c *Conn) Hibernate(ctx context.Context, host string) (Status, error) {
	var s Status
	err := c.callJSON(ctx, http.MethodPost, host, OpHibernate, nil, &s)
	return s, err
}

// Resume asks the provider to serve host again after a Hibernate.
func (c *Conn) Resume(ctx context.Context, host string) (Status, error) {
	var s Status
	err := c.callJSON(ctx, http.MethodPost, host, OpResume, nil, &s)
	return s, err
}

// Delete asks the provider to stop hosting host; its 404 counts as done.
func (c *Conn) Delete(ctx context.Context, host string) error {
	err := c.callJSON(ctx, http.MethodDelete, host, OpSpace, nil, nil)
	if NotFound(err) {
		return nil
	}
	return err
}

// PutState sends host's state to the provider as an export, written by write.
func (c *Conn) PutState(ctx context.Context, host string, write func(io.Writer) error) (Imported, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(write(pw)) }()
	var imp Imported
	err := c.call(ctx, http.MethodPut, host, OpState, pr, ExportContentType, func(r io.Reader) error {
		if err := json.NewDecoder(io.LimitReader(r, maxAnswer)).Decode(&imp); err != nil {
			return fmt.Errorf("provider %s: an answer that is not the API's JSON", c.P.Name)
		}
		return nil
	})
	pr.CloseWithError(errors.New("call ended"))
	return imp, err
}

// Export reads host's state from the provider as an export, handed to read.
func (c *Conn) Export(ctx context.Context, host string, read func(io.Reader) error) error {
	return c.call(ctx, http.MethodGet, host, OpExport, nil, "", read)
}

// Interface guards
var _ http.RoundTripper = (*Conn)(nil)

// Addr is the provider's host:port, as its base URL names it.
func (c *Conn) Addr() string {
	if c.base.Port() == "" {
		return net.JoinHostPort(c.base.Hostname(), "443")
	}
	return c.base.Host
}
