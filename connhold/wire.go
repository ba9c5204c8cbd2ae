package connhold

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The wire between the box and an instance (docs/connections.md is the contract).
const (
	// EventPath is where the box POSTs a connection's events on the instance's socket.
	EventPath = "/.lchat/ws/event"

	// HoldHeader, on the instance's answer to a WebSocket upgrade request, opts the
	// connection in: with the value HoldValue and a 2xx status the box completes the
	// handshake itself and holds the connection. Any other answer (a 101 included) is
	// proxied as today: a 101 becomes the byte tunnel.
	HoldHeader = "Lchat-Ws"
	HoldValue  = "hold"

	ConnIDHeader     = "Lchat-Conn-Id"    // on the upgrade request and every event
	SeqHeader        = "Lchat-Seq"        // the event's sequence number: 1, 2, ... per connection
	EventHeader      = "Lchat-Event"      // text, binary or close
	RedeliveryHeader = "Lchat-Redelivery" // "1" when the event may have reached an instance before
	TagsHeader       = "Lchat-Conn-Tags"  // the connection's tags, comma-separated
	MetaHeader       = "Lchat-Conn-Meta"  // the connection's metadata, base64url (no padding)
	CloseCodeHeader  = "Lchat-Close-Code" // on a close event: the code (1005: none, 1006: no close frame)

	// Set on an answer (to the upgrade, to an event, on a control call).
	SetTagsHeader      = "Lchat-Set-Tags"      // replace the tags: comma-separated, empty clears
	SetMetaHeader      = "Lchat-Set-Meta"      // replace the metadata: base64url, empty clears
	CloseHeader        = "Lchat-Close"         // close the connection with this code after the answer's messages
	CloseReasonHeader  = "Lchat-Close-Reason"  // its reason (≤ 123 bytes)
	AutoRequestHeader  = "Lchat-Auto-Request"  // a text message the box answers itself ...
	AutoResponseHeader = "Lchat-Auto-Response" // ... with this text, without waking the space

	// EventsContentType is Pushpin's WebSocket-over-HTTP event encoding, accepted in an
	// answer's body to carry several messages: "TEXT <hex length>\r\n<payload>\r\n",
	// BINARY the same, "CLOSE <hex length>\r\n<2-byte code><reason>\r\n".
	EventsContentType = "application/websocket-events"
)

// ReservedPrefix is the path namespace of the box's own requests to an instance: the box
// refuses client requests under it (404), so an instance knows a request there came from
// the box.
const ReservedPrefix = "/.lchat/"

// Reserved reports whether a client request's path is in the box's namespace. Paths are
// compared after cleaning, so "/x/../.lchat/ws/event" is reserved too.
func Reserved(urlPath string) bool {
	p := path.Clean("/" + urlPath)
	return p == strings.TrimSuffix(ReservedPrefix, "/") || strings.HasPrefix(p, ReservedPrefix)
}

// Limits of the contract.
const (
	MaxMeta         = 16 << 10 // metadata per connection
	MaxTags         = 10       // tags per connection
	MaxTagLen       = 256      // bytes per tag
	MaxAutoResponse = 2048     // bytes of an auto-request or auto-response
)

// Kind is what an event is.
type Kind string

const (
	KindText   Kind = "text"
	KindBinary Kind = "binary"
	KindClose  Kind = "close"
)

// Event is one connection event for the space's instance.
type Event struct {
	Space  string
	ConnID string
	// Seq numbers a connection's events from 1 in the order the client sent them; a
	// redelivery keeps its number, so an instance that stored the highest Seq it handled
	// can drop duplicates.
	Seq        uint64
	Kind       Kind
	Payload    []byte // the message; for a close, the reason
	CloseCode  int    // for a close
	Redelivery bool
	Tags       []string
	Meta       []byte
	// Prior names the instances that acknowledged earlier messages of this connection
	// that no completed checkpoint is known to hold (relay.go): a Deliverer whose instance
	// is not one of them answers a ReplayError instead of delivering.
	Prior []At
}

// Message is one message to send to a client.
type Message struct {
	Binary  bool
	Payload []byte
}

// Reply is the instance's answer to an event (or to the upgrade): messages to send back at
// once, and changes to the connection. A Deliverer returns it only for an acknowledged
// event (a 2xx answer).
type Reply struct {
	Messages []Message
	// SetTags, when non-nil, replaces the tags.
	SetTags *[]string
	// SetMeta, when non-nil, replaces the metadata.
	SetMeta *[]byte
	// CloseCode, when non-zero, closes the connection after Messages.
	CloseCode   int
	CloseReason string
	// AutoRequest and AutoResponse (both set) make a text message equal to AutoRequest
	// answered with AutoResponse by the box, without an event.
	AutoRequest, AutoResponse string

	// Set by the Deliverer: At is the instance that acknowledged the event. Mark, when
	// non-zero, is the acknowledgement's mark on the Relay of the box At names (another
	// box: a checkpoint there covers it by Notice); Covered is the highest mark there a
	// checkpoint is known to hold.
	At            At
	Mark, Covered uint64
	// Durable, set by the Deliverer, says the acknowledgement's commits are in the
	// bucket already (a kind of durability bucket: the instance's answer waited for
	// them): the message is dropped at once, not kept for a checkpoint, and is never
	// delivered again.
	Durable bool
}

// Deliverer carries events to a space's instance, waking it if need be. The engine glue
// implements it (PostEvent over the instance's Unix socket). A nil error means the
// instance acknowledged the event; any error leaves it pending, to be delivered again
// marked as a redelivery.
type Deliverer interface {
	Deliver(ctx context.Context, ev Event) (Reply, error)
}

// NewEventRequest is ev as the HTTP request the instance receives: POST EventPath, the
// event in headers, the message (or close reason) as the body. base is the URL the client
// dials (for a Unix socket, "http://<host>").
func NewEventRequest(ctx context.Context, base string, ev Event) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+EventPath, bytes.NewReader(ev.Payload))
	if err != nil {
		return nil, err
	}
	h := req.Header
	h.Set(ConnIDHeader, ev.ConnID)
	h.Set(SeqHeader, strconv.FormatUint(ev.Seq, 10))
	h.Set(EventHeader, string(ev.Kind))
	if ev.Redelivery {
		h.Set(RedeliveryHeader, "1")
	} else {
		h.Set(RedeliveryHeader, "0")
	}
	if len(ev.Tags) > 0 {
		h.Set(TagsHeader, strings.Join(ev.Tags, ","))
	}
	if len(ev.Meta) > 0 {
		h.Set(MetaHeader, base64.RawURLEncoding.EncodeToString(ev.Meta))
	}
	switch ev.Kind {
	case KindBinary:
		h.Set("Content-Type", "application/octet-stream")
	case KindClose:
		h.Set(CloseCodeHeader, strconv.Itoa(ev.CloseCode))
		fallthrough
	default:
		h.Set("Content-Type", "text/plain; charset=utf-8")
	}
	return req, nil
}

// MaxAnswer bounds an answer's body (to an event, or a control call's) that the box reads:
// the largest message an app can send to a client. A longer answer is a failed delivery.
const MaxAnswer = 16 << 20

// ErrNotDelivered, wrapped in a Deliverer's error, says no instance can have seen the
// event (the box refused it, the instance's socket took no connection): its next delivery
// is not marked as a redelivery.
var ErrNotDelivered = errors.New("event not delivered")

// ErrNotAcknowledged is a Deliverer's error for an answer that was not a 2xx.
var ErrNotAcknowledged = errors.New("instance did not acknowledge the event")

// PostEvent delivers ev with client (which dials the instance), and decodes the answer:
// a 2xx acknowledges the event and its body and headers are the Reply (ParseReply); any
// other status, or no answer, is an error and leaves the event pending.
func PostEvent(ctx context.Context, client Doer, base string, ev Event) (Reply, error) {
	req, err := NewEventRequest(ctx, base, ev)
	if err != nil {
		return Reply{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return Reply{}, fmt.Errorf("%w: status %d", ErrNotAcknowledged, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer+1))
	if err != nil {
		return Reply{}, fmt.Errorf("reading the answer: %w", err)
	}
	if len(body) > MaxAnswer {
		return Reply{}, fmt.Errorf("answer over %d bytes", MaxAnswer)
	}
	return ParseReply(resp.Header, body)
}

// ParseReply reads an answer's changes from its header and messages from its body: with
// Content-Type EventsContentType the body is a sequence of events (ParseEvents); otherwise
// a non-empty body is one message, binary when its type is application/octet-stream, else
// text (which must be UTF-8).
func ParseReply(h http.Header, body []byte) (Reply, error) {
	var r Reply
	if vs, ok := h[http.CanonicalHeaderKey(SetTagsHeader)]; ok {
		tags, err := parseTags(strings.Join(vs, ","))
		if err != nil {
			return Reply{}, err
		}
		r.SetTags = &tags
	}
	if vs, ok := h[http.CanonicalHeaderKey(SetMetaHeader)]; ok {
		meta, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(strings.Join(vs, ""), "="))
		if err != nil {
			return Reply{}, fmt.Errorf("%s: not base64url", SetMetaHeader)
		}
		if len(meta) > MaxMeta {
			return Reply{}, fmt.Errorf("%s: %d bytes, over %d", SetMetaHeader, len(meta), MaxMeta)
		}
		r.SetMeta = &meta
	}
	if v := h.Get(CloseHeader); v != "" {
		code, err := strconv.Atoi(v)
		if err != nil || !sendableCode(code) {
			return Reply{}, fmt.Errorf("%s: %q is not a close code one may send", CloseHeader, v)
		}
		r.CloseCode = code
		r.CloseReason = h.Get(CloseReasonHeader)
		if len(r.CloseReason) > 123 {
			r.CloseReason = r.CloseReason[:123]
		}
	}
	if req, resp := h.Get(AutoRequestHeader), h.Get(AutoResponseHeader); req != "" && resp != "" {
		if len(req) > MaxAutoResponse || len(resp) > MaxAutoResponse {
			return Reply{}, fmt.Errorf("auto-response over %d bytes", MaxAutoResponse)
		}
		r.AutoRequest, r.AutoResponse = req, resp
	}
	if len(body) == 0 {
		return r, nil
	}
	ct, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	switch ct {
	case EventsContentType:
		msgs, code, reason, err := ParseEvents(body)
		if err != nil {
			return Reply{}, err
		}
		r.Messages = msgs
		if code != 0 && r.CloseCode == 0 {
			r.CloseCode, r.CloseReason = code, reason
		}
	case "application/octet-stream":
		r.Messages = []Message{{Binary: true, Payload: body}}
	default:
		if !utf8.Valid(body) {
			return Reply{}, errors.New("a text answer that is not UTF-8")
		}
		r.Messages = []Message{{Payload: body}}
	}
	return r, nil
}

// ConnHeaders reads what an event's header (TagsHeader, MetaHeader) says of its
// connection: its tags and metadata, within the contract's limits; none is no tags, no
// metadata.
func ConnHeaders(h http.Header) (tags []string, meta []byte, err error) {
	if tags, err = parseTags(h.Get(TagsHeader)); err != nil {
		return nil, nil, err
	}
	if v := h.Get(MetaHeader); v != "" {
		meta, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(v, "="))
		if err != nil || len(meta) > MaxMeta {
			return nil, nil, fmt.Errorf("%s: not base64url of at most %d bytes", MetaHeader, MaxMeta)
		}
	}
	return tags, meta, nil
}

// sendableCode reports whether an app may close with code: 1000, 1001, 1008, 1011, 1012,
// 1013, or one of the registered or private ranges 3000-4999.
func sendableCode(code int) bool {
	switch code {
	case 1000, 1001, 1008, 1011, 1012, 1013:
		return true
	}
	return code >= 3000 && code <= 4999
}

// parseTags splits a comma-separated tag list, within MaxTags and MaxTagLen.
func parseTags(s string) ([]string, error) {
	tags := []string{}
	for t := range strings.SplitSeq(s, ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			continue
		}
		if len(t) > MaxTagLen {
			return nil, fmt.Errorf("tag over %d bytes", MaxTagLen)
		}
		tags = append(tags, t)
	}
	if len(tags) > MaxTags {
		return nil, fmt.Errorf("%d tags, over %d", len(tags), MaxTags)
	}
	return tags, nil
}

// ParseEvents decodes a body in Pushpin's WebSocket-over-HTTP encoding (EventsContentType):
// TEXT and BINARY events become messages; a CLOSE event (its payload a 2-byte code and a
// reason) ends the list and returns its code. OPEN, PING and PONG events are accepted and
// ignored (the box answers pings itself). An event's length is checked against what is
// left of the body, so an event of any size the body holds is read whole.
func ParseEvents(body []byte) (msgs []Message, closeCode int, reason string, err error) {
	for len(body) > 0 {
		nl := bytes.IndexByte(body, '\n')
		if nl < 0 {
			return nil, 0, "", errors.New("websocket-events: truncated event line")
		}
		line := string(bytes.TrimSuffix(body[:nl], []byte("\r")))
		body = body[nl+1:]
		name, hexLen, hasLen := strings.Cut(line, " ")
		var payload []byte
		if hasLen {
			n, err := strconv.ParseUint(hexLen, 16, 31)
			if err != nil || n > uint64(len(body)) {
				return nil, 0, "", fmt.Errorf("websocket-events: bad length in %q", truncate(line))
			}
			payload = bytes.Clone(body[:n])
			if !bytes.HasPrefix(body[n:], []byte("\r\n")) {
				return nil, 0, "", errors.New("websocket-events: payload not followed by CRLF")
			}
			body = body[n+2:]
		}
		switch name {
		case "TEXT":
			if !utf8.Valid(payload) {
				return nil, 0, "", errors.New("websocket-events: TEXT that is not UTF-8")
			}
			msgs = append(msgs, Message{Payload: payload})
		case "BINARY":
			msgs = append(msgs, Message{Binary: true, Payload: payload})
		case "CLOSE":
			code := CloseNormal
			if len(payload) >= 2 {
				code = int(binary.BigEndian.Uint16(payload))
				reason = string(payload[2:])
			}
			if !sendableCode(code) {
				return nil, 0, "", fmt.Errorf("websocket-events: close code %d one may not send", code)
			}
			return msgs, code, reason, nil
		case "OPEN", "PING", "PONG":
		default:
			return nil, 0, "", fmt.Errorf("websocket-events: unknown event %q", truncate(name))
		}
	}
	return msgs, 0, "", nil
}

// AppendEvent appends m in the websocket-events encoding (for apps and tests written in Go).
func AppendEvent(b []byte, m Message) []byte {
	name := "TEXT"
	if m.Binary {
		name = "BINARY"
	}
	b = fmt.Appendf(b, "%s %x\r\n", name, len(m.Payload))
	b = append(b, m.Payload...)
	return append(b, '\r', '\n')
}

// AppendClose appends a CLOSE event with code and reason in the websocket-events encoding.
func AppendClose(b []byte, code int, reason string) []byte {
	b = fmt.Appendf(b, "CLOSE %x\r\n", 2+len(reason))
	b = binary.BigEndian.AppendUint16(b, uint16(code))
	b = append(b, reason...)
	return append(b, '\r', '\n')
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
