package engine_test

import (
	"crypto/rand"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// TestMain doubles as the test instance: the engine runs this test binary with
// LCHAT_TEST_INSTANCE=1 (set through the kind's Env), so the tests drive a real process that
// listens on $LCHAT_SOCKET and keeps a SQLite database in $LCHAT_DATA_DIR.
func TestMain(m *testing.M) {
	if os.Getenv("LCHAT_TEST_INSTANCE") == "1" {
		runInstance()
		return
	}
	os.Exit(m.Run())
}

func runInstance() {
	dataDir, sock := os.Getenv("LCHAT_DATA_DIR"), os.Getenv("LCHAT_SOCKET")
	if f := os.Getenv("STARTS_FILE"); f != "" {
		fh, err := os.OpenFile(f, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintf(fh, "%d\n", os.Getpid())
			fh.Close()
		}
	}
	if os.Getenv("HANG") == "1" {
		select {}
	}
	if ms, _ := strconv.Atoi(os.Getenv("START_DELAY_MS")); ms > 0 {
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	db.SetMaxOpenConns(1)
	for _, q := range []string{
		"CREATE TABLE IF NOT EXISTS msgs (id INTEGER PRIMARY KEY, body TEXT)",
		"CREATE TABLE IF NOT EXISTS wakes (reason TEXT)",
		"CREATE TABLE IF NOT EXISTS fill (data BLOB)",
	} {
		if _, err := db.Exec(q); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("POST /msg", func(w http.ResponseWriter, r *http.Request) {
		if _, err := db.Exec("INSERT INTO msgs (body) VALUES (?)", r.URL.Query().Get("body")); err != nil {
			http.Error(w, err.Error(), 500)
		}
	})
	mux.HandleFunc("GET /msgs", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(strings.Join(column(db, "SELECT body FROM msgs ORDER BY id"), "\n")))
	})
	mux.HandleFunc("GET /wakes", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(strings.Join(column(db, "SELECT reason FROM wakes"), "\n")))
	})
	mux.HandleFunc("POST /wake", func(w http.ResponseWriter, r *http.Request) {
		db.Exec("INSERT INTO wakes (reason) VALUES (?)", r.Header.Get("X-Lchat-Wake-Reason"))
	})
	mux.HandleFunc("POST /crash", func(w http.ResponseWriter, r *http.Request) { os.Exit(3) })
	mux.HandleFunc("POST /next-wake", func(w http.ResponseWriter, r *http.Request) {
		os.MkdirAll(filepath.Join(dataDir, ".lchat"), 0o700)
		os.WriteFile(filepath.Join(dataDir, ".lchat", "next-wake"), []byte(r.URL.Query().Get("at")), 0o600)
	})
	mux.HandleFunc("POST /fill", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("bytes"))
		buf := make([]byte, 64<<10)
		for n > 0 {
			rand.Read(buf)
			if _, err := db.Exec("INSERT INTO fill (data) VALUES (?)", buf[:min(n, len(buf))]); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			n -= len(buf)
		}
	})
	mux.HandleFunc("GET /env", func(w http.ResponseWriter, r *http.Request) {
		v, ok := os.LookupEnv(r.URL.Query().Get("name"))
		if !ok {
			v = "<unset>"
		}
		w.Write([]byte(v))
	})
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := &http.Server{Handler: mux}
	stop := syscall.SIGTERM
	if os.Getenv("IGNORE_TERM") != "" {
		// A stubborn instance: SIGTERM does nothing, only SIGKILL stops it.
		signal.Ignore(syscall.SIGTERM)
		stop = syscall.SIGUSR2
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, stop)
		<-sig
		srv.Close()
	}()
	srv.Serve(ln)
	db.Close()
	os.Exit(0)
}

func column(db *sql.DB, q string) []string {
	rows, err := db.Query(q)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		rows.Scan(&s)
		out = append(out, s)
	}
	return out
}

func openDBAt(tb testing.TB, p string) *sql.DB {
	db, err := sql.Open("sqlite", "file:"+p+"?_pragma=journal_mode(WAL)")
	if err != nil {
		tb.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	return db
}
