package demospace

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" driver
)

// DBFile is the name of the chat database inside the data directory.
const DBFile = "chat.db"

// Message kinds.
const (
	KindUser   = "user"
	KindSystem = "system"
)

// Message is one chat line.
type Message struct {
	ID        int64     `json:"id"`
	Author    string    `json:"author"`
	Text      string    `json:"text"`
	Kind      string    `json:"kind"`
	CreatedAt time.Time `json:"created_at"`
}

// Reminder is a message the room will receive at a given time.
type Reminder struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	Text      string    `json:"text"`
	CreatedAt time.Time `json:"created_at"`
}

// store is the SQLite database of one space. Writers are serialized by the
// Server (writeMu), so that message ids reach subscribers in order.
type store struct {
	db *sql.DB
}

const schema = `
CREATE TABLE IF NOT EXISTS messages (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	author     TEXT    NOT NULL,
	text       TEXT    NOT NULL,
	kind       TEXT    NOT NULL DEFAULT 'user',
	created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS reminders (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	at_unix    INTEGER NOT NULL,
	text       TEXT    NOT NULL,
	created_ms INTEGER NOT NULL,
	fired_ms   INTEGER
);
CREATE INDEX IF NOT EXISTS reminders_pending ON reminders (at_unix) WHERE fired_ms IS NULL;
`

// openStore opens (creating if needed) the database at path. WAL lets the
// hibernation engine take a consistent snapshot with VACUUM INTO while we write.
func openStore(ctx context.Context, path string) (*store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	dsn := (&url.URL{Scheme: "file", Path: abs, RawQuery: q.Encode()}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening %s: %v", abs, err)
	}
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("creating schema: %v", err)
	}
	return &store{db: db}, nil
}

// Close closes the database. Closing the last connection checkpoints the WAL
// into chat.db, so a stopped instance leaves a single self-contained file.
func (s *store) Close() error { return s.db.Close() }

// insertMessage stores a message and returns it with its id.
func (s *store) insertMessage(ctx context.Context, author, text, kind string, now time.Time) (Message, error) {
	return insertMessage(ctx, s.db, author, text, kind, now)
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func insertMessage(ctx context.Context, db execer, author, text, kind string, now time.Time) (Message, error) {
	now = now.UTC().Truncate(time.Millisecond)
	res, err := db.ExecContext(ctx,
		`INSERT INTO messages (author, text, kind, created_ms) VALUES (?, ?, ?, ?)`,
		author, text, kind, now.UnixMilli())
	if err != nil {
		return Message{}, fmt.Errorf("inserting message: %v", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return Message{}, fmt.Errorf("inserting message: %v", err)
	}
	return Message{ID: id, Author: author, Text: text, Kind: kind, CreatedAt: now}, nil
}

// latestID is the id of the newest message, 0 when there is none.
func (s *store) latestID(ctx context.Context) (int64, error) {
	var id int64
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) FROM messages`).Scan(&id); err != nil {
		return 0, fmt.Errorf("reading the latest message id: %v", err)
	}
	return id, nil
}

// messages returns up to limit messages with id > after, oldest first. With
// after < 0 it returns the latest limit messages, oldest first.
func (s *store) messages(ctx context.Context, after int64, limit int) ([]Message, error) {
	var rows *sql.Rows
	var err error
	if after < 0 {
		rows, err = s.db.QueryContext(ctx, `SELECT id, author, text, kind, created_ms FROM
			(SELECT * FROM messages ORDER BY id DESC LIMIT ?) ORDER BY id`, limit)
	} else {
		rows, err = s.db.QueryContext(ctx, `SELECT id, author, text, kind, created_ms FROM messages
			WHERE id > ? ORDER BY id LIMIT ?`, after, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("listing messages: %v", err)
	}
	defer rows.Close()
	out := []Message{}
	for rows.Next() {
		var m Message
		var ms int64
		if err := rows.Scan(&m.ID, &m.Author, &m.Text, &m.Kind, &ms); err != nil {
			return nil, fmt.Errorf("listing messages: %v", err)
		}
		m.CreatedAt = time.UnixMilli(ms).UTC()
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing messages: %v", err)
	}
	return out, nil
}

// insertReminder stores a pending reminder.
func (s *store) insertReminder(ctx context.Context, at time.Time, text string, now time.Time) (Reminder, error) {
	now = now.UTC().Truncate(time.Millisecond)
	res, err := s.db.ExecContext(ctx,
		`INSERT INTO reminders (at_unix, text, created_ms) VALUES (?, ?, ?)`,
		at.Unix(), text, now.UnixMilli())
	if err != nil {
		return Reminder{}, fmt.Errorf("inserting reminder: %v", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return Reminder{}, fmt.Errorf("inserting reminder: %v", err)
	}
	return Reminder{ID: id, At: time.Unix(at.Unix(), 0).UTC(), Text: text, CreatedAt: now}, nil
}

// pendingReminders lists reminders that have not fired, earliest first.
func (s *store) pendingReminders(ctx context.Context) ([]Reminder, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, at_unix, text, created_ms FROM reminders
		WHERE fired_ms IS NULL ORDER BY at_unix, id`)
	if err != nil {
		return nil, fmt.Errorf("listing reminders: %v", err)
	}
	defer rows.Close()
	out := []Reminder{}
	for rows.Next() {
		var r Reminder
		var at, ms int64
		if err := rows.Scan(&r.ID, &at, &r.Text, &ms); err != nil {
			return nil, fmt.Errorf("listing reminders: %v", err)
		}
		r.At = time.Unix(at, 0).UTC()
		r.CreatedAt = time.UnixMilli(ms).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing reminders: %v", err)
	}
	return out, nil
}

// nextReminder returns the time of the earliest pending reminder.
func (s *store) nextReminder(ctx context.Context) (time.Time, bool, error) {
	var at sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT MIN(at_unix) FROM reminders WHERE fired_ms IS NULL`).Scan(&at)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("reading next reminder: %v", err)
	}
	if !at.Valid {
		return time.Time{}, false, nil
	}
	return time.Unix(at.Int64, 0).UTC(), true, nil
}

// fireDue turns every pending reminder due at now into a system message, in
// one transaction, and returns the messages posted.
func (s *store) fireDue(ctx context.Context, now time.Time) (posted []Message, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("firing reminders: %v", err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	rows, err := tx.QueryContext(ctx, `SELECT id, text FROM reminders
		WHERE fired_ms IS NULL AND at_unix <= ? ORDER BY at_unix, id`, now.Unix())
	if err != nil {
		return nil, fmt.Errorf("firing reminders: %v", err)
	}
	type due struct {
		id   int64
		text string
	}
	var dues []due
	for rows.Next() {
		var d due
		if err := rows.Scan(&d.id, &d.text); err != nil {
			rows.Close()
			return nil, fmt.Errorf("firing reminders: %v", err)
		}
		dues = append(dues, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("firing reminders: %v", err)
	}
	for _, d := range dues {
		m, err := insertMessage(ctx, tx, systemAuthor, "Reminder: "+d.text, KindSystem, now)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE reminders SET fired_ms = ? WHERE id = ?`,
			now.UTC().UnixMilli(), d.id); err != nil {
			return nil, fmt.Errorf("firing reminders: %v", err)
		}
		posted = append(posted, m)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("firing reminders: %v", err)
	}
	return posted, nil
}

// systemAuthor is the author of messages the room posts itself.
const systemAuthor = "lchat"

var errClosed = errors.New("server is shutting down")
