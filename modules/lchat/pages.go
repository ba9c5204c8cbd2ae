package lchat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lchat/lchat-caddy/connhold"
)

// The pages a client gets in place of Caddy's empty error answer when the box refuses a
// request: a host that is no space on this box (404), and a space it cannot serve now
// (503, with Retry-After). Each is HTML, JSON or plain text by the request's Accept. A
// page names the host asked for and nothing else of the box: no other tenant's host, no
// peer, no path, no reason from the box's internals (those go to the log). A site with
// its own error routes (handle_errors) gets the error to render instead.

// pageKind is which page a refusal is answered with.
type pageKind int

const (
	pageUnknownHost pageKind = iota // 404: no route for the host on this box
	pageUnavailable                 // 503: the space cannot be served now
)

// pageError is the error of a refusal the handler answers with a page (answerPage). Its
// text is the refusal's own, for the log and for a site's error routes.
type pageError struct {
	kind       pageKind
	retryAfter int // seconds, as in the Retry-After header; pageUnavailable only
	err        error
}

func (e *pageError) Error() string { return e.err.Error() }
func (e *pageError) Unwrap() error { return e.err }

// answerPage answers err, the error ServeHTTP's request came to, with its page when it
// is a refusal that has one (pageError) and nothing of the answer went out yet; it then
// logs the refusal and returns nil. Any other error is returned as it is: to Caddy, which
// answers its status with an empty body, or to the site's error routes.
func (p *proxying) answerPage(err error) error {
	var he caddyhttp.HandlerError
	var pe *pageError
	if err == nil || !errors.As(err, &he) || !errors.As(err, &pe) || p.out == nil || p.out.Written() ||
		connhold.Reserved(p.r.URL.Path) || siteHandlesErrors(p.r) {
		return err
	}
	writePage(p.out, p.r, he.StatusCode, p.host, pe)
	lvl := zapcore.DebugLevel
	if he.StatusCode >= 500 {
		lvl = zapcore.ErrorLevel // as Caddy logs a handler's 5xx
	}
	if c := p.h.log().Check(lvl, "refused"); c != nil {
		c.Write(zap.String("host", p.host), zap.Int("status", he.StatusCode), zap.Int("hops", p.hops),
			zap.String("method", p.r.Method), zap.String("path", p.r.URL.Path), zap.Error(pe.err))
	}
	return nil
}

// siteHandlesErrors reports whether the request's server has error routes
// (handle_errors): then they answer the refusal, not the page.
func siteHandlesErrors(r *http.Request) bool {
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	return srv != nil && srv.Errors != nil && len(srv.Errors.Routes) > 0
}

// pageFormat is a page's media type.
type pageFormat int

const (
	pageText pageFormat = iota // the default: curl and anything that says nothing
	pageHTML
	pageJSON
)

var pageOffers = [...]struct {
	format pageFormat
	media  string
}{{pageText, "text/plain"}, {pageHTML, "text/html"}, {pageJSON, "application/json"}}

// pageFormatOf picks a page's format from an Accept header (RFC 9110, section 12.5.1):
// the offer with the highest q, where a media range that names the type exactly counts
// before type/* and */*; on a tie, the offer the header lists first; plain text when the
// header says nothing to choose by (none, */*, or only types the box has no page in).
func pageFormatOf(accept string) pageFormat {
	type match struct {
		q           float64
		specificity int // 3 exact, 2 type/*, 1 */*, 0 none
		position    int
	}
	var best [len(pageOffers)]match
	for pos, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		q := 1.0
		if v, ok := params["q"]; ok {
			if q, err = strconv.ParseFloat(v, 64); err != nil {
				continue
			}
		}
		for i, o := range pageOffers {
			spec := 0
			switch typ, _, _ := strings.Cut(o.media, "/"); mt {
			case o.media:
				spec = 3
			case typ + "/*":
				spec = 2
			case "*/*":
				spec = 1
			}
			if spec > best[i].specificity {
				best[i] = match{q: q, specificity: spec, position: pos}
			}
		}
	}
	choice, top := pageText, match{}
	for i, m := range best {
		if m.specificity == 0 || m.q <= 0 {
			continue
		}
		if m.q > top.q || m.q == top.q && (m.specificity > top.specificity ||
			m.specificity == top.specificity && m.position < top.position) {
			choice, top = pageOffers[i].format, m
		}
	}
	return choice
}

// pageContent is what a page says.
type pageContent struct {
	Status     int    `json:"status"`
	Message    string `json:"error"` // what an API client shows, as the admin API's errors
	Code       string `json:"code"`  // not_a_space, unavailable
	Host       string `json:"host"`
	RetryAfter int    `json:"retry_after,omitempty"`
	Title      string `json:"-"`
	Detail     string `json:"-"`
	Refresh    bool   `json:"-"` // an HTML 503 of a GET reloads itself after RetryAfter
}

func pageContentOf(status int, host string, pe *pageError, method string) pageContent {
	if pe.kind == pageUnknownHost {
		return pageContent{Status: status, Code: "not_a_space", Host: host,
			Message: host + " is not a space on this server.",
			Title:   "No space here",
			Detail: "Nothing is served at this address here. Check the address; a space created " +
				"a moment ago may take a few seconds to reach this server."}
	}
	secs := max(pe.retryAfter, 1)
	return pageContent{Status: status, Code: "unavailable", Host: host, RetryAfter: secs,
		Message: fmt.Sprintf("%s is not available right now; try again in %d seconds.", host, secs),
		Title:   "Not available right now",
		Detail: fmt.Sprintf("The space may be starting up or moving between servers. "+
			"Try again in %d seconds.", secs),
		Refresh: method == http.MethodGet}
}

var pageTmpl = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{{if .Refresh}}<meta http-equiv="refresh" content="{{.RetryAfter}}">
{{end}}<title>{{.Title}}</title>
<style>
  :root { color-scheme: light dark; font-family: system-ui, sans-serif; }
  body { max-width: 36rem; margin: 15vh auto 0; padding: 1rem; line-height: 1.5; }
  h1 { font-size: 1.3rem; overflow-wrap: anywhere; }
  p { opacity: 0.8; }
  small { opacity: 0.6; }
</style>
</head>
<body>
<h1>{{.Message}}</h1>
<p>{{.Detail}}{{if .Refresh}} This page tries again by itself.{{end}}</p>
<p><small>{{.Status}} · {{.Host}}</small></p>
</body>
</html>
`))

// writePage writes the page of a refusal (status, pe) for host to w, in the format the
// request's Accept prefers; a HEAD gets its header alone.
func writePage(w http.ResponseWriter, r *http.Request, status int, host string, pe *pageError) {
	c := pageContentOf(status, host, pe, r.Method)
	var body bytes.Buffer
	var ctype string
	switch pageFormatOf(r.Header.Get("Accept")) {
	case pageHTML:
		ctype = "text/html; charset=utf-8"
		if err := pageTmpl.Execute(&body, c); err != nil {
			panic(err) // a fixed template over strings cannot fail
		}
	case pageJSON:
		ctype = "application/json"
		json.NewEncoder(&body).Encode(c)
	default:
		ctype = "text/plain; charset=utf-8"
		fmt.Fprintf(&body, "%d %s: %s\n", status, http.StatusText(status), c.Message)
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Length", strconv.Itoa(body.Len()))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Add("Vary", "Accept")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		w.Write(body.Bytes()) // a client gone: nothing else to tell it
	}
}
