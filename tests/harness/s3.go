package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/s3bucket"
	"github.com/lchat/lchat-caddy/internal/testwait"
)

// S3 is a running versitygw (posix backend) serving one fresh bucket on 127.0.0.1.
type S3 struct {
	// Endpoint is the server's base URL, http://127.0.0.1:<port>.
	Endpoint string
	// Bucket is the bucket created for this test.
	Bucket string
	// Region is the region requests are signed for.
	Region string
	// AccessKey and SecretKey are the server's root credentials, random per server.
	AccessKey, SecretKey string
	// Root is the directory versitygw stores buckets in.
	Root string
	// LogFile receives the server's output; its tail is printed when the test fails.
	LogFile string

	cmd *exec.Cmd
	// exited is closed once the server's process has exited (its only writer is the
	// goroutine that waits for it), after exitErr is set.
	exited   chan struct{}
	exitErr  error
	nBuckets atomic.Int64
}

// StartS3 starts versitygw on a free port with a temporary root and root credentials,
// waits until it answers, creates a bucket, and stops the server when the test ends.
// It takes well under a second once the binary is built, so call it per test.
func StartS3(t testing.TB) *S3 {
	t.Helper()
	bin := Tool(t, "versitygw")
	dir := t.TempDir()
	s := &S3{
		Region:    "us-east-1",
		AccessKey: "lchat-" + randHex(6),
		SecretKey: randHex(20),
		Root:      filepath.Join(dir, "root"),
		LogFile:   filepath.Join(dir, "versitygw.log"),
	}
	if err := os.Mkdir(s.Root, 0o755); err != nil {
		t.Fatal(err)
	}
	// The port stays reserved (FreePort) until the test ends: no other process can take it
	// before versitygw binds it.
	lastErr := s.start(bin, FreeAddr(t, "127.0.0.1"))
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("versitygw log tail (%s):\n%s", s.LogFile, tail(s.LogFile, 40))
		}
	})
	if lastErr != nil {
		t.Fatalf("starting versitygw: %v\n%s", lastErr, tail(s.LogFile, 40))
	}
	s.Bucket = s.CreateBucket(t)
	return s
}

func (s *S3) start(bin, addr string) error {
	s.Endpoint = "http://" + addr
	logf, err := os.OpenFile(s.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--port", addr, "--region", s.Region, "--quiet", "--keep-alive", "posix", s.Root)
	// Credentials go through the environment, not argv, so `ps` does not show them.
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKey, "ROOT_SECRET_ACCESS_KEY="+s.SecretKey)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.watch(cmd)
	// Ready when a request signed with this server's random credentials succeeds: a
	// bare HTTP answer could come from another test's server that took the port first.
	client, err := s.rawClient()
	if err != nil {
		return err
	}
	return s.waitReady("versitygw", 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := client.ListBuckets(ctx, &s3.ListBucketsInput{})
		return err
	})
}

// PID is the process id of the server.
func (s *S3) PID() int { return s.cmd.Process.Pid }

// watch records cmd, started, as the server's process and closes s.exited when it exits.
func (s *S3) watch(cmd *exec.Cmd) {
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func() {
		s.exitErr = cmd.Wait()
		close(s.exited)
	}()
}

// waitReady asks probe on WaitFor's curve until it succeeds (nil), the server exits, or
// timeout passes (the error then carries probe's last answer).
func (s *S3) waitReady(name string, timeout time.Duration, probe func() error) error {
	var lastErr error
	up := false
	testwait.Poll(timeout, func() bool {
		select {
		case <-s.exited:
			return true
		default:
		}
		lastErr = probe()
		up = lastErr == nil
		return up
	})
	switch {
	case up:
		return nil
	case s.hasExited():
		return fmt.Errorf("%s exited: %v", name, s.exitErr)
	}
	return fmt.Errorf("%s did not accept a signed request on %s within %v: %v", name, s.Endpoint, timeout, lastErr)
}

func (s *S3) hasExited() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// stop kills the server's process group and waits (up to 2 s) for it to go.
func (s *S3) stop() {
	if s.cmd == nil || s.cmd.Process == nil || s.hasExited() {
		return
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(2 * time.Second):
	}
}

// CreateBucket creates another fresh bucket on this server and returns its name.
func (s *S3) CreateBucket(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("lchat-test-%d-%s", s.nBuckets.Add(1), randHex(4))
	client := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("creating bucket %s: %v", name, err)
	}
	return name
}

// Config is the s3bucket configuration for this server's bucket under prefix.
func (s *S3) Config(prefix string) s3bucket.Config {
	return s3bucket.Config{
		Bucket:          s.Bucket,
		Prefix:          prefix,
		Region:          s.Region,
		Endpoint:        s.Endpoint,
		UsePathStyle:    true,
		AccessKeyID:     s.AccessKey,
		SecretAccessKey: s.SecretKey,
	}
}

// NewBucket returns a bucket.Bucket on this server's bucket under prefix.
func (s *S3) NewBucket(t testing.TB, prefix string) bucket.Bucket {
	t.Helper()
	b, err := s3bucket.New(context.Background(), s.Config(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Client is a raw S3 client for this server, for tests that need more than the
// bucket interface.
func (s *S3) Client(t testing.TB) *s3.Client {
	t.Helper()
	client, err := s.rawClient()
	if err != nil {
		t.Fatal(err)
	}
	return client
}

func (s *S3) rawClient() (*s3.Client, error) {
	cfg := s.Config("")
	cfg.Bucket = "any" // the client is not bound to a bucket
	b, err := s3bucket.New(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	return b.Client(), nil
}

// Env is the environment an lchat-caddy process needs to use this bucket under prefix.
func (s *S3) Env(prefix string) []string {
	return []string{
		"LCHAT_HIBERNATE_BUCKET=" + s.Bucket,
		"LCHAT_HIBERNATE_PREFIX=" + prefix,
		"AWS_ENDPOINT_URL_S3=" + s.Endpoint,
		"AWS_REGION=" + s.Region,
		"AWS_ACCESS_KEY_ID=" + s.AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + s.SecretKey,
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return lastLines(string(b), n)
}
