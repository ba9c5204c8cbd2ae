package held

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
)

// Deliver carries ev through the request path's one door (box.Serve, eventDoor) to its
// space's instance: here, waking the space, or on the peer that runs it. The delivery is
// a use of the space like any request, so the space sleeps its idle timeout after the
// last one. An error leaves the event pending.
func (c *Conns) Deliver(ctx context.Context, ev connhold.Event) (connhold.Reply, error) {
	d := &eventDoor{c: c, ctx: ctx, ev: ev}
	if err := c.box.Serve(ctx, box.Request{Host: ev.Space}, d); err != nil {
		return connhold.Reply{}, err
	}
	return d.reply, d.err
}

// At names the awake instance use holds on this box.
func (c *Conns) At(use *engine.Use) connhold.At {
	at := connhold.At{Box: c.box.Self(), Incarnation: "-", Instance: use.Instance()}
	if ms := c.box.Mesh(); ms != nil {
		at.Incarnation = ms.Incarnation()
	}
	return at
}

// eventDoor carries one event through box.Serve (box.Proxy): to this box's instance,
// waking the space here, or forwarded once to the peer that runs it.
type eventDoor struct {
	c     *Conns
	ctx   context.Context
	ev    connhold.Event
	reply connhold.Reply
	err   error
}

// errEventRefused wraps the box's refusal of an event (no route, unavailable): the event
// stays pending.
type errEventRefused struct{ ref box.Refusal }

func (e errEventRefused) Error() string {
	return fmt.Sprintf("event refused (%d): %v", e.ref.Status, e.ref.Err)
}

// Is: a refused event reached no instance.
func (e errEventRefused) Is(t error) bool { return t == connhold.ErrNotDelivered }

func (d *eventDoor) Instance(use *engine.Use) error {
	c, ev := d.c, d.ev
	now := c.At(use)
	if stale := connhold.StaleAt(ev.Prior, now); len(stale) > 0 {
		d.err = &connhold.ReplayError{Stale: stale}
		return nil
	}
	c.EnsureControl(ev.Space)
	reply, err := connhold.PostEvent(d.ctx, c.client(ev.Space, use.Socket()), "http://"+ev.Space, ev)
	if box.IsDialError(err) {
		use.Unreachable()
		err = fmt.Errorf("%w: %w", connhold.ErrNotDelivered, err)
	}
	if err == nil {
		// The acknowledgement (and the messages it sends) counts once the commits the
		// instance made for it are in the bucket; until then the event is redelivered.
		// It is retired at once only when the log carries all the instance's state.
		if werr := use.WaitDurable(d.ctx); werr != nil {
			reply, err = connhold.Reply{}, fmt.Errorf("%w: %w", connhold.ErrNotAcknowledged, werr)
		} else {
			reply.Durable = use.LogCarriesAll()
		}
	}
	reply.At = now
	d.reply, d.err = reply, err
	return nil
}

func (d *eventDoor) Live(string) error {
	d.err = fmt.Errorf("%s is a live route: it holds no connections", d.ev.Space)
	return nil
}

func (d *eventDoor) Refuse(ref box.Refusal) error {
	d.err = errEventRefused{ref}
	return nil
}

// Forward posts the event to the peer d names, marked as forwarded (box.PeerTransport):
// the peer delivers it to its instance and answers with the instance's answer and its
// acknowledgement's stamp (connhold.AckAtHeader), or 409 to ask for a replay first. A
// peer that could not be reached is NotSent: box.Serve forgets it as the space's holder.
func (d *eventDoor) Forward(dec mesh.Decision) (box.Forwarded, error) {
	c, ev := d.c, d.ev
	u, err := url.Parse(dec.Peer)
	if err != nil {
		d.err = fmt.Errorf("forward: bad peer URL")
		return box.Answered, nil
	}
	req, err := connhold.NewEventRequest(d.ctx, u.Scheme+"://"+ev.Space, ev)
	if err != nil {
		d.err = err
		return box.Answered, nil
	}
	req = req.WithContext(box.WithPeer(req.Context(), box.Peer{Self: dec.Peer, Hint: dec.Hint}))
	req.Header.Set(connhold.EntryHeader, c.box.Self())
	for _, p := range ev.Prior {
		req.Header.Add(connhold.PriorHeader, p.String())
	}
	resp, err := c.peerTransport().RoundTrip(req)
	if err != nil {
		if box.IsDialError(err) {
			return box.NotSent, err
		}
		d.err = err
		return box.Answered, nil
	}
	defer resp.Body.Close()
	d.reply, d.err = readForwardedAnswer(resp)
	return box.Answered, nil
}

// readForwardedAnswer decodes a peer's answer to a forwarded event.
func readForwardedAnswer(resp *http.Response) (connhold.Reply, error) {
	if resp.StatusCode == http.StatusConflict && len(resp.Header.Values(connhold.ReplayHeader)) > 0 {
		re := &connhold.ReplayError{}
		for _, v := range resp.Header.Values(connhold.ReplayHeader) {
			at, err := connhold.ParseAt(v)
			if err != nil {
				return connhold.Reply{}, fmt.Errorf("peer's replay answer: %w", err)
			}
			re.Stale = append(re.Stale, at)
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return connhold.Reply{}, re
	}
	if resp.StatusCode/100 != 2 {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		err := fmt.Errorf("%w: status %d from the peer", connhold.ErrNotAcknowledged, resp.StatusCode)
		if resp.Header.Get(connhold.RefusedHeader) != "" {
			err = fmt.Errorf("%w: %w", connhold.ErrNotDelivered, err)
		}
		return connhold.Reply{}, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, connhold.MaxAnswer+1))
	if err != nil {
		return connhold.Reply{}, fmt.Errorf("reading the peer's answer: %w", err)
	}
	if len(body) > connhold.MaxAnswer {
		return connhold.Reply{}, fmt.Errorf("%w: the peer's answer is over %d bytes", connhold.ErrNotAcknowledged, connhold.MaxAnswer)
	}
	reply, err := connhold.ParseReply(resp.Header, body)
	if err != nil {
		return connhold.Reply{}, err
	}
	if reply.At, err = connhold.ParseAt(resp.Header.Get(connhold.AckAtHeader)); err != nil {
		return connhold.Reply{}, fmt.Errorf("peer's acknowledgement: %w", err)
	}
	reply.Mark, _ = strconv.ParseUint(resp.Header.Get(connhold.AckMarkHeader), 10, 64)
	reply.Covered, _ = strconv.ParseUint(resp.Header.Get(connhold.CoveredHeader), 10, 64)
	reply.Durable = resp.Header.Get(connhold.DurableHeader) != ""
	if reply.Mark == 0 {
		return connhold.Reply{}, errors.New("peer's acknowledgement has no mark")
	}
	return reply, nil
}

// peerTransport is the mesh's forward transport for events, made once.
func (c *Conns) peerTransport() *box.PeerTransport {
	c.ptOnce.Do(func() { c.pt = c.box.Mesh().PeerTransport(nil) })
	return c.pt
}

// Accept completes the handshake of a client's WebSocket whose instance opted in (its
// answer: header and body) and holds it here under id; a bad answer is a *box.Error 502,
// a handshake the client got wrong a *box.Error 400.
func (c *Conns) Accept(w http.ResponseWriter, r *http.Request, host, id string, header http.Header, body []byte) error {
	// The kept answer's header is still on w's (HoldWriter): whatever the outcome, none
	// of it reaches the client (an error answer is written with w's header).
	clear(w.Header())
	reply, err := connhold.ParseReply(header, body)
	if err != nil {
		return &box.Error{Status: http.StatusBadGateway, Err: fmt.Errorf("space %s: its answer holding a WebSocket: %w", host, err)}
	}
	if _, err := c.hub.Accept(w, r, host, id, reply, header.Get("Sec-WebSocket-Protocol")); err != nil {
		return &box.Error{Status: http.StatusBadRequest, Err: err}
	}
	c.EnsureControl(host)
	return nil
}
