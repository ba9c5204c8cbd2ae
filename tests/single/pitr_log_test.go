package single

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// bucketPast waits until what the bucket stamps on a new object is after at: an object
// written next lands after at at the bucket's precision (S3 lists whole seconds).
func bucketPast(t *testing.T, bkt bucket.Bucket, at time.Time) {
	t.Helper()
	harness.WaitFor(t, 10*time.Second, "the bucket's clock past "+at.String(), func() bool {
		if _, err := bkt.Put(context.Background(), "probe", strings.NewReader("p"), 1, bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
		info, err := bkt.Head(context.Background(), "probe")
		return err == nil && info.LastModified.After(at)
	})
}

// TestRestoreToATimeBetweenLoggedWrites: a real box, the demo space of a kind with
// durability bucket. A message, a sleep (a checkpoint); then two messages, each answered
// only once its log segment landed, and the space sleeps again (a checkpoint that folds
// them). `history` lists the log after the first checkpoint; `restore --at` a time
// between the two messages brings back exactly the messages before it, though no
// checkpoint ever held that state. `history` of a host without a route and `restore`
// without --at fail with the documented codes.
func TestRestoreToATimeBetweenLoggedWrites(t *testing.T) {
	e := newEnv(t)
	b := harness.StartBox(t, harness.BoxOptions{Env: e.s3.Env(e.prefix), JSON: harness.Config{Lchat: map[string]any{
		"kinds": map[string]any{
			"logged": harness.DemoKind(map[string]any{
				"idle_timeout": "3s",
				"durability":   "bucket",
				"replication":  map[string]any{"class": "sleep"},
			}),
		},
	}}.JSON()})
	const host = "pitrlog.example.com"
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "logged"}, 201, nil)
	asleep := func() bool { st, _ := space(t, b, host); return st == "asleep" }

	postMessage(t, b, host, "before-checkpoint")
	harness.WaitFor(t, 30*time.Second, "space asleep", asleep)
	postMessage(t, b, host, "logged-first")
	at := time.Now()
	bucketPast(t, e.bkt, at)
	postMessage(t, b, host, "logged-second")
	harness.WaitFor(t, 30*time.Second, "space asleep", asleep)

	table, err := b.CLI("history", host)
	if err != nil || !strings.Contains(table, "SEGMENTS") {
		t.Fatalf("history: %v\n%s", err, table)
	}
	logged := false
	for _, line := range strings.Split(table, "\n")[1:] {
		f := strings.Fields(line)
		logged = logged || len(f) == 5 && f[3] != "-" && f[3] != "0"
	}
	if !logged {
		t.Fatalf("history shows no checkpoint with log segments:\n%s", table)
	}

	out, err := b.CLI("restore", host, "--at", at.UTC().Format(time.RFC3339Nano))
	if err != nil || !strings.Contains(out, "log segments") {
		t.Fatalf("restore --at %v: %v\n%s", at, err, out)
	}
	got := messages(t, b, host)
	if !strings.Contains(got, "before-checkpoint") || !strings.Contains(got, "logged-first") || strings.Contains(got, "logged-second") {
		t.Fatalf("after restore --at a time between the logged messages the space holds:\n%s", got)
	}

	if r := b.CLIRun("history", "nosuch.localhost"); r.Code != 1 || !strings.Contains(r.Stderr, "no route") {
		t.Fatalf("history of a host without a route: exit %d, %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if r := b.CLIRun("restore", host); r.Code != 4 || !strings.Contains(r.Stderr, "--at: required") {
		t.Fatalf("restore without --at: exit %d, %q", r.Code, r.Stderr)
	}
}
