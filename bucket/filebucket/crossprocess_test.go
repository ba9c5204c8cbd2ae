package filebucket_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

const (
	childEnv   = "FILEBUCKET_TEST_CHILD_ROOT"
	crossKeys  = 200
	childProcs = 2
)

// TestCrossProcess races conditional writes from two processes sharing one root: for
// every key, exactly one process's create wins, and exactly one swap from the shared
// base ETag wins. The flock-based locking is what makes this hold.
func TestCrossProcess(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("running as a child")
	}
	root := t.TempDir()
	b, err := filebucket.New(root)
	if err != nil {
		t.Fatal(err)
	}
	// Swap targets share one base ETag.
	var base bucket.Info
	for i := range crossKeys {
		if base, err = b.Put(context.Background(), fmt.Sprintf("swap/%d", i), strings.NewReader("base"), 4, bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
	}

	type child struct {
		cmd   *exec.Cmd
		start *os.File
		out   *bufio.Scanner
	}
	var children []child
	for p := range childProcs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrossProcessChild$", "-test.v")
		cmd.Env = append(os.Environ(), childEnv+"="+root, fmt.Sprintf("FILEBUCKET_TEST_CHILD_ID=%d", p), "FILEBUCKET_TEST_BASE_ETAG="+base.ETag)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, child{cmd, stdin.(*os.File), bufio.NewScanner(stdout)})
	}
	// Wait until both are ready, then release them together.
	for p, c := range children {
		ready := false
		for !ready && c.out.Scan() {
			ready = c.out.Text() == "ready"
			if strings.HasPrefix(c.out.Text(), "error ") {
				t.Errorf("child %d: %s", p, c.out.Text())
			}
		}
		if !ready {
			t.Fatalf("child %d exited before it was ready", p)
		}
	}
	for _, c := range children {
		fmt.Fprintln(c.start, "go")
		c.start.Close()
	}
	wins := map[string][]string{}
	for p, c := range children {
		for c.out.Scan() {
			line := c.out.Text()
			if key, ok := strings.CutPrefix(line, "won "); ok {
				wins[key] = append(wins[key], fmt.Sprint(p))
			}
			if strings.HasPrefix(line, "error ") {
				t.Errorf("child %d: %s", p, line)
			}
		}
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", p, err)
		}
	}
	perProc := make([]int, childProcs)
	for _, kind := range []string{"create", "swap"} {
		for i := range crossKeys {
			key := fmt.Sprintf("%s/%d", kind, i)
			w := wins[key]
			if len(w) != 1 {
				t.Fatalf("%s: %d winners %v across processes, want exactly 1", key, len(w), w)
			}
			obj, err := b.Get(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			data := make([]byte, 64)
			n, _ := obj.Body.Read(data)
			obj.Body.Close()
			if want := "process " + w[0]; string(data[:n]) != want {
				t.Fatalf("%s: stored %q, winner was %s", key, data[:n], want)
			}
			var p int
			fmt.Sscan(w[0], &p)
			perProc[p]++
		}
	}
	t.Logf("wins per process: %v (both processes winning some shows they really raced)", perProc)
}

// TestCrossProcessChild is the child half of TestCrossProcess.
func TestCrossProcessChild(t *testing.T) {
	root := os.Getenv(childEnv)
	if root == "" {
		t.Skip("only run as a child of TestCrossProcess")
	}
	id := os.Getenv("FILEBUCKET_TEST_CHILD_ID")
	baseETag := os.Getenv("FILEBUCKET_TEST_BASE_ETAG")
	b, err := filebucket.New(root)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n')
	body := "process " + id
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < crossKeys; i += 4 {
				for _, tc := range []struct {
					key  string
					cond bucket.Cond
				}{
					{fmt.Sprintf("create/%d", i), bucket.Cond{IfNoneMatch: true}},
					{fmt.Sprintf("swap/%d", i), bucket.Cond{IfMatch: baseETag}},
				} {
					_, err := b.Put(context.Background(), tc.key, strings.NewReader(body), int64(len(body)), tc.cond)
					mu.Lock()
					switch {
					case err == nil:
						fmt.Println("won", tc.key)
					case !errors.Is(err, bucket.ErrPreconditionFailed):
						fmt.Println("error", err)
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
}
