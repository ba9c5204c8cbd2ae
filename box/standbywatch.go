package box

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/standby"
)

// Failover without waiting out dead_after (engine.TakeOver). A box that stands by for
// spaces of another box (its spool holds their streams) keeps one watch open to that box
// (GET mesh.PathWatch). When the watch breaks, the standby dials the holder's address
// again: refused (the machine answers, nothing listens: the process is gone), or answered
// by a new incarnation, the holder is dead, and the standby takes over each space it
// streams at once, sealing the stream and the log before the instance starts, so that
// even a wrong verdict costs no acknowledged write (the old holder, were it alive, could
// acknowledge nothing more). A holder that cannot be reached at all (a dead machine, a
// partition) proves nothing: its spaces wait for its heartbeat to die, as before. A holder
// that exits cleanly says so on the watch ("exiting"): its drain puts its spaces to sleep.

// watchRetry spaces the tries of a watch that could not be opened (the holder answered,
// but not with its watch: a reload, an error).
const watchRetry = 500 * time.Millisecond

// A dial reset rather than refused is tried again after resetRetry, maxResets times in a row.
const (
	resetRetry = 10 * time.Millisecond
	maxResets  = 20
)

// watchScan is how often the watcher looks for holders to watch in the spool.
const watchScan = 500 * time.Millisecond

// ServeWatch answers a peer's watch (mesh.PathWatch): this box's incarnation at once, then
// nothing until this box exits ("exiting") or done closes (a config reload), or the peer
// goes away.
func (b *Box) ServeWatch(w http.ResponseWriter, r *http.Request, done <-chan struct{}) error {
	w.Header().Set(mesh.IncarnationHeader, b.mesh.m.Config().Incarnation)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return err
	}
	select {
	case <-r.Context().Done():
	case <-done:
		io.WriteString(w, "reload\n")
	case <-b.exiting:
		io.WriteString(w, "exiting\n")
	}
	return nil
}

// standbyWatch is the standby side: one watch per holder the spool streams from.
type standbyWatch struct {
	b      *Box
	ctx    context.Context
	client *http.Client  // the peer transport, no overall timeout: a watch lasts
	kick   chan struct{} // a stream arrived: scan now (buffered 1)
	mu     sync.Mutex
	on     map[string]bool // holders with a watcher
	opened map[string]bool // holders whose watch is open now
}

// startStandbyWatch starts the watcher; it ends with the mesh.
func (b *Box) startStandbyWatch() {
	ms := b.mesh
	// A transport of its own, keeping no idle connection: the dial after a watch broke is
	// the verdict, so it must be a new connection (one kept alive from before the holder
	// died fails with a reset, not a refusal, and costs a retry).
	var tr http.RoundTripper = ms.client.HTTPClient.Transport
	if t, ok := tr.(*http.Transport); ok {
		t = t.Clone()
		t.DisableKeepAlives = true
		tr = t
	}
	w := &standbyWatch{b: b, ctx: ms.ctx, on: map[string]bool{}, opened: map[string]bool{}, kick: make(chan struct{}, 1),
		client: &http.Client{Transport: tr}}
	b.watch = w
	safego.Go(nil, ms.logger, "standby watch", w.scan)
}

// KickStandbyWatch has the watcher look at the spool now: a segment arrived, maybe of a
// holder it does not watch yet.
func (b *Box) KickStandbyWatch() {
	if b.watch == nil {
		return
	}
	select {
	case b.watch.kick <- struct{}{}:
	default:
	}
}

// StandbyFor is one space this box stands by for (its spool's stream) and whether its
// holder is watched now (a holder found dead is taken over at once: standbywatch.go).
type StandbyFor struct {
	standby.HostStatus
	Watching bool `json:"watching"`
	// Warm: this box keeps the checkpoint of the stream's generation warm for a takeover
	// (engine.Prewarm); false while it downloads, or when the bucket holds a newer
	// checkpoint than the stream's (its own stream warms it).
	Warm bool `json:"warm"`
}

// standbyFor is what the spool holds, with the watches.
func (b *Box) standbyFor() []StandbyFor {
	if b.standby == nil {
		return nil
	}
	var out []StandbyFor
	for _, st := range b.standby.spool.Status() {
		f := StandbyFor{HostStatus: st}
		if g, ok := b.eng.WarmGeneration(st.Host); ok && g == st.Gen {
			f.Warm = true
		}
		if b.watch != nil {
			b.watch.mu.Lock()
			f.Watching = b.watch.opened[st.Holder]
			b.watch.mu.Unlock()
		}
		out = append(out, f)
	}
	return out
}

// holders is the live holders, other than this box, whose streams the spool keeps and
// that no takeover sealed, with their hosts.
func (w *standbyWatch) holders() map[string][]string {
	ms := w.b.mesh
	out := map[string][]string{}
	for _, st := range w.b.standby.spool.Status() {
		if st.Holder == "" || st.Holder == ms.cfg.Self || st.Sealed || st.Broken != "" || !ms.node.IsLiveMember(st.Holder) {
			continue
		}
		out[st.Holder] = append(out[st.Holder], st.Host)
	}
	return out
}

func (w *standbyWatch) scan() {
	t := time.NewTicker(watchScan)
	defer t.Stop()
	for {
		for holder := range w.holders() {
			w.mu.Lock()
			if !w.on[holder] {
				w.on[holder] = true
				safego.Go(nil, w.b.mesh.logger, "standby watch of a holder", func() { w.watch(holder) })
			}
			w.mu.Unlock()
		}
		select {
		case <-w.ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
		}
	}
}

// watch keeps a watch open to holder while the spool streams from it, and takes its
// spaces over once it is found dead.
func (w *standbyWatch) watch(holder string) {
	defer func() {
		w.mu.Lock()
		delete(w.on, holder)
		w.mu.Unlock()
	}()
	log := w.b.mesh.logger.With(zap.String("holder", holder))
	inc, failing, resets := "", false, 0
	for w.ctx.Err() == nil {
		if _, ok := w.holders()[holder]; !ok {
			return // no stream of it left to stand by for, or no longer a live member
		}
		got, why, err := w.open(holder, func(got string) {
			switch {
			case inc == "":
				log.Info("watching a holder this box stands by for", zap.String("incarnation", got))
			case got != inc:
				// The holder restarted: the incarnation that held the leases is gone.
				// Taken over as soon as the new one answers, while its watch goes on.
				w.takeOver(holder, inc, "restarted")
			}
			inc = got
		})
		switch {
		case errors.Is(err, syscall.ECONNREFUSED) && inc != "":
			w.takeOver(holder, inc, "its address refuses connections")
			return
		case got == "" && err != nil && !failing && !errors.Is(err, syscall.ECONNRESET):
			log.Warn("cannot watch a holder this box stands by for: its spaces wait for its heartbeat if it dies", zap.Error(err))
		}
		failing = got == "" && err != nil
		if why == "exiting" {
			// A clean exit: its drain puts the spaces to sleep and frees their leases.
			log.Info("holder exiting: its spaces are put to sleep by its drain")
			return
		}
		if got == "" || why == "reload" {
			// Not opened (the holder answered otherwise, or could not be reached), or
			// ended by a reload: try again shortly. A watch that broke is opened again
			// at once: that dial is the verdict. A dial reset rather than refused comes
			// while a dying process's listener goes (the kernel accepted, then the socket
			// closed): it is tried again at once, a few times.
			wait := watchRetry
			if errors.Is(err, syscall.ECONNRESET) && resets < maxResets {
				resets++
				wait = resetRetry
			}
			select {
			case <-w.ctx.Done():
			case <-time.After(wait):
			}
		} else {
			resets = 0
		}
	}
}

// open holds one watch of holder open until it ends: the incarnation it answered with (also
// told to answered as soon as the answer comes), the line it ended with ("exiting",
// "reload"; "" when it broke) and the error that ended it.
func (w *standbyWatch) open(holder string, answered func(inc string)) (inc, why string, err error) {
	req, err := http.NewRequestWithContext(w.ctx, http.MethodGet, strings.TrimSuffix(holder, "/")+mesh.PathWatch, nil)
	if err != nil {
		return "", "", err
	}
	req.Header.Set("Authorization", "Bearer "+string(w.b.mesh.client.Token))
	resp, err := w.client.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", "", errors.New(resp.Status)
	}
	inc = resp.Header.Get(mesh.IncarnationHeader)
	answered(inc)
	w.mu.Lock()
	w.opened[holder] = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.opened, holder)
		w.mu.Unlock()
	}()
	line, err := bufio.NewReader(io.LimitReader(resp.Body, 64)).ReadString('\n')
	return inc, strings.TrimSpace(line), err
}

// takeOver takes over every space whose stream the spool keeps from holder, found dead at
// incarnation inc.
func (w *standbyWatch) takeOver(holder, inc, why string) {
	hosts := w.holders()[holder]
	log := w.b.mesh.logger.With(zap.String("holder", holder), zap.String("why", why))
	log.Warn("holder gone before its heartbeat: taking over the spaces this box stands by for", zap.Strings("hosts", hosts))
	for _, host := range hosts {
		safego.Go(nil, log, "standby takeover", func() {
			start := time.Now()
			rt, ok := w.b.reg.Lookup(host)
			if !ok || !rt.Hibernate || rt.Delegated() {
				return
			}
			ctx, cancel := context.WithTimeout(w.ctx, time.Minute)
			defer cancel()
			// A stream outlives its space's sleep here: take over only what the dead
			// holder still held (not released, not taken since), or a space that slept
			// would wake on this box for nothing.
			if l, _, err := spacestore.ReadLease(ctx, w.b.bucket, host); err != nil || l.Released || l.Holder != holder || l.Incarnation != inc {
				if err != nil {
					log.Warn("standby takeover: reading the lease", zap.String("host", host), zap.Error(err))
				}
				return
			}
			u, err := w.b.eng.TakeOver(ctx, SpaceOf(rt), holder, inc)
			w.b.NoteTakeover(host, holder, why, time.Since(start), err)
			if err != nil {
				if !errors.Is(err, engine.ErrNotStandby) {
					log.Error("standby takeover failed", zap.String("host", host), zap.Error(err))
				}
				return
			}
			u.Release()
			log.Info("took the space over from its dead holder", zap.String("host", host), zap.Duration("took", time.Since(start)))
		})
	}
}
