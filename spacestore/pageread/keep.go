package pageread

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the pure-Go "sqlite" driver: the write lock
)

// Keeper keeps one SQLite connection per database between views, so that a view of a
// database read again and again (a log segment after each group of commits) costs a BEGIN
// IMMEDIATE and a ROLLBACK on it rather than opening a connection, which is most of what a
// small view costs. Its owner closes it when done with the databases (Close).
//
// What a kept connection holds between views: no transaction, so no read mark and no write
// lock; the instance's reads, writes and checkpoints (TRUNCATE included) go on as if it
// were not there. But it is an open connection to a database in WAL mode: it holds a shared
// lock on the -shm file's "alive" byte (SQLite's SHARED lock on the database file too,
// until the view's own close of the file lets the kernel drop it), and SQLite refuses
// the exclusive lock on the database file while another process holds that byte. So
// while a connection is kept:
//   - the instance cannot leave WAL mode (journal_mode=DELETE waits for it, then fails
//     with SQLITE_BUSY), nor take locking_mode=EXCLUSIVE;
//   - the instance's last connection to close is not the last: it leaves the WAL and -shm
//     files in place, and the kept connection, closed by Forget, Close or an eviction,
//     checkpoints the WAL into the database and deletes them if it is the last then (as a
//     view's own connection did when the instance held none open). Likewise the kept
//     connection's close leaves them while the instance has the database open.
//
// The kept connection is checked against the file at the path at every view: if the
// instance replaced or renamed the database (another device and inode at the path), the
// view drops it and locks a new one, so a view never reads one file under another's
// lock. A connection that fails to lock (for another reason than a writer holding the
// lock) or to roll back is dropped too. A Keeper is safe for concurrent use; a database
// whose kept connection a view holds is read by a second view on a connection of its own.
type Keeper struct {
	mu     sync.Mutex
	conns  map[string]*conn
	tick   uint64
	closed bool
}

// MaxKept bounds the connections a Keeper keeps (each holds three file descriptors and a
// mapping of the -shm file): past it, the one least recently used is closed.
const MaxKept = 64

// NewKeeper returns a Keeper that keeps nothing yet.
func NewKeeper() *Keeper { return &Keeper{conns: make(map[string]*conn)} }

// Open is the package's Open on the connection kept for p, made and kept if there is none.
func (k *Keeper) Open(ctx context.Context, p string, since *WALPos) (*View, error) {
	return open(ctx, k, p, since, false)
}

// OpenTail is Open for a log segment, which reads only the pages changed since the WALPos:
// its tail view is read without the lock when the frames vouch for themselves (follow.go);
// IndexAll and Scan then take the lock and may find the database further on.
func (k *Keeper) OpenTail(ctx context.Context, p string, since *WALPos) (*View, error) {
	return open(ctx, k, p, since, true)
}

// Forget closes the connection kept for p, if any (at the end of the view that holds it,
// if one does): the database is gone, or idle.
func (k *Keeper) Forget(p string) {
	k.mu.Lock()
	c := k.conns[p]
	if c != nil {
		delete(k.conns, p)
		if c.busy {
			c = nil // put closes it: it is no longer the kept one
		}
	}
	k.mu.Unlock()
	if c != nil {
		c.close()
	}
}

// Kept lists the paths with a kept connection.
func (k *Keeper) Kept() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]string, 0, len(k.conns))
	for p := range k.conns {
		out = append(out, p)
	}
	return out
}

// Close closes every kept connection (one a view holds at its Close); views opened after it
// use connections of their own. It is idempotent.
func (k *Keeper) Close() error {
	k.mu.Lock()
	k.closed = true
	var idle []*conn
	for p, c := range k.conns {
		delete(k.conns, p)
		if !c.busy {
			idle = append(idle, c)
		}
	}
	k.mu.Unlock()
	for _, c := range idle {
		c.close()
	}
	return nil
}

// take returns a connection to lock p on: the kept one (kept true) unless a view holds it,
// else a new one, kept from now on if there is room. A nil Keeper always gives a new one.
func (k *Keeper) take(ctx context.Context, p string) (c *conn, kept bool, err error) {
	if k != nil {
		k.mu.Lock()
		k.tick++
		if c := k.conns[p]; c != nil && !c.busy {
			c.busy, c.used = true, k.tick
			k.mu.Unlock()
			return c, true, nil
		}
		k.mu.Unlock()
	}
	if c, err = dialConn(ctx, p); err != nil || k == nil {
		return c, false, err
	}
	var evicted *conn
	k.mu.Lock()
	if _, ok := k.conns[p]; !ok && !k.closed {
		if len(k.conns) >= MaxKept {
			evicted = k.lruLocked()
		}
		c.busy, c.used = true, k.tick
		k.conns[p] = c
	}
	k.mu.Unlock()
	if evicted != nil {
		evicted.close()
	}
	return c, false, nil
}

// lruLocked removes and returns the kept connection used longest ago that no view holds.
func (k *Keeper) lruLocked() *conn {
	var old *conn
	var oldPath string
	for p, c := range k.conns {
		if !c.busy && (old == nil || c.used < old.used) {
			old, oldPath = c, p
		}
	}
	if old != nil {
		delete(k.conns, oldPath)
	}
	return old
}

// put takes c back after a view (without its lock): kept if keep and it is still the kept
// connection of its path, else closed.
func (k *Keeper) put(c *conn, keep bool) {
	if k != nil {
		k.mu.Lock()
		mine := k.conns[c.path] == c
		if mine && keep && !k.closed {
			c.busy = false
			k.mu.Unlock()
			return
		}
		if mine {
			delete(k.conns, c.path)
		}
		k.mu.Unlock()
	}
	c.close()
}

// conn is one SQLite connection to a database, which takes the write lock for views.
type conn struct {
	path     string
	db       *sql.DB
	c        *sql.Conn
	dev, ino uint64 // the file at path when the connection was opened
	// used (the keeper's tick at its last take) and busy (a view holds it) are guarded by
	// the keeper's mu.
	used uint64
	busy bool
}

// dialConn opens a connection to the database at p. The file's identity is taken before: a
// view checks, under the lock, that the file then at p is the same, so the connection
// opened that file and not one renamed over it meanwhile. The connection only takes the
// write lock; no statement reads the schema. The pragmas are defence in depth should SQLite
// parse more than the header and the WAL index.
func dialConn(ctx context.Context, p string) (*conn, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	c := &conn{path: p}
	c.dev, c.ino = fileID(fi)
	if c.db, err = sql.Open("sqlite", SQLiteURI(p)+hardening); err != nil {
		return nil, err
	}
	c.db.SetMaxOpenConns(1)
	if c.c, err = c.db.Conn(ctx); err == nil && !sqliteWaits {
		// begin waits for the write lock itself (SQLite's handler then sleeps no more).
		_, err = c.c.ExecContext(ctx, "PRAGMA busy_timeout = 0")
	}
	if err != nil {
		if c.c != nil {
			c.c.Close()
		}
		c.db.Close()
		return nil, err
	}
	return c, nil
}

// Waiting for the write lock. SQLite's busy handler sleeps 1, 2, 5, 10 ms and more between
// its tries, up to 100 ms a sleep; among an instance's writers taking turns on the lock a
// view that waited that way lost the lock to them again and again, holding its segment
// (and every answer that waits for it) back: in BenchmarkViewUnderWriters its wait's p99 was
// 1.2-1.5 s, against 62-118 ms polling. begin tries again after lockPoll instead, doubling
// up to lockPollMax, for lockWait in all: the busy timeout the connection had before.
//
// sqliteWaits (a benchmark's comparison) leaves the waiting to SQLite's handler.
var sqliteWaits = false

const (
	lockPoll    = 50 * time.Microsecond
	lockPollMax = 200 * time.Microsecond
	lockWait    = 10 * time.Second
)

// begin takes the database's write lock (BEGIN IMMEDIATE), waiting for it up to lockWait
// (an error that busy matches) or the end of ctx.
func (c *conn) begin(ctx context.Context) error {
	deadline := time.Now().Add(lockWait)
	var timer *time.Timer
	for wait := lockPoll; ; wait = min(2*wait, lockPollMax) {
		_, err := c.c.ExecContext(ctx, "BEGIN IMMEDIATE")
		if err != nil && ctx.Err() != nil {
			return ctx.Err() // the driver's interrupt, or a busy answer: the ctx ended
		}
		if err == nil || !busy(err) || time.Now().Add(wait).After(deadline) {
			return err
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
	}
}

func (c *conn) rollback() error {
	_, err := c.c.ExecContext(context.Background(), "ROLLBACK")
	return err
}

func (c *conn) close() {
	c.c.Close()
	c.db.Close()
}

// busy reports whether err is SQLite's SQLITE_BUSY (or one of its extended codes): a
// writer held the lock past the busy timeout.
func busy(err error) bool {
	var e interface{ Code() int }
	return errors.As(err, &e) && e.Code()&0xff == 5
}
