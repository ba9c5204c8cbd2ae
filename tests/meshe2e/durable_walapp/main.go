// Command durable_walapp is an instance whose SQLite database (WAL mode) moves its WAL
// under the log shipper's feet: every $WALAPP_CHECKPOINT_EVERY-th insert (default 8) it
// runs PRAGMA wal_checkpoint itself, in turn TRUNCATE (the WAL file cut to zero bytes),
// RESTART (the next commit writes the WAL from its start with new salts) and PASSIVE.
// For tests/meshe2e's durability-bucket tests (durable_wal_test.go).
//
//	POST /rows    inserts the body as a row (with 3 KB of random padding: a page or
//	              more per commit), 201 {"id": n}
//	POST /later   answers 202 at once, then inserts the body as a row 300 ms later (a
//	              timer's write: the commit answers nobody)
//	GET  /rows    every row, [{"id": n, "text": "..."}], by id
//	GET  /stats   the checkpoints run: {"TRUNCATE": n, "RESTART": n, "PASSIVE": n}
//	              count the complete ones (SQLite's busy 0), "busy" the others
//	GET  /check   PRAGMA integrity_check's answer ("ok")
package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	_ "modernc.org/sqlite"
)

func main() {
	every := 8
	if v := os.Getenv("WALAPP_CHECKPOINT_EVERY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			log.Fatalf("WALAPP_CHECKPOINT_EVERY=%q: want a positive number", v)
		}
		every = n
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	path := filepath.Join(os.Getenv("LCHAT_DATA_DIR"), "rows.db")
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path, RawQuery: q.Encode()}).String())
	if err != nil {
		log.Fatal(err)
	}
	db.SetMaxOpenConns(1) // one connection: each checkpoint runs between two commits
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY AUTOINCREMENT, text TEXT NOT NULL, pad BLOB)`); err != nil {
		log.Fatal(err)
	}

	var mu sync.Mutex // an insert and the checkpoint after it, one at a time
	inserts := 0
	modes := []string{"TRUNCATE", "RESTART", "PASSIVE"}
	stats := map[string]int{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("POST /rows", func(w http.ResponseWriter, r *http.Request) {
		text, err := io.ReadAll(io.LimitReader(r.Body, 4096))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		res, err := db.Exec(`INSERT INTO rows (text, pad) VALUES (?, randomblob(3000))`, string(text))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		if inserts++; inserts%every == 0 {
			mode := modes[(inserts/every-1)%len(modes)]
			var busy, frames, done int
			if err := db.QueryRow("PRAGMA wal_checkpoint("+mode+")").Scan(&busy, &frames, &done); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if busy == 0 {
				stats[mode]++
			} else {
				stats["busy"]++
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	mux.HandleFunc("POST /later", func(w http.ResponseWriter, r *http.Request) {
		text, err := io.ReadAll(io.LimitReader(r.Body, 4096))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		time.AfterFunc(300*time.Millisecond, func() {
			mu.Lock()
			defer mu.Unlock()
			if _, err := db.Exec(`INSERT INTO rows (text, pad) VALUES (?, randomblob(3000))`, string(text)); err != nil {
				log.Printf("later insert: %v", err)
			}
		})
	})
	mux.HandleFunc("GET /rows", func(w http.ResponseWriter, r *http.Request) {
		rows, err := db.Query(`SELECT id, text FROM rows ORDER BY id`)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer rows.Close()
		type row struct {
			ID   int64  `json:"id"`
			Text string `json:"text"`
		}
		out := []row{}
		for rows.Next() {
			var x row
			if err := rows.Scan(&x.ID, &x.Text); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			out = append(out, x)
		}
		if err := rows.Err(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		json.NewEncoder(w).Encode(stats)
	})
	mux.HandleFunc("GET /check", func(w http.ResponseWriter, r *http.Request) {
		var res string
		if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&res); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, res)
	})
	sock := os.Getenv("LCHAT_SOCKET")
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.Serve(ln, mux))
}
