package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// SeaweedPkg is SeaweedFS's command, built from its own module (tools/s3second/go.mod) so
// neither the main module nor tools/go.mod carries its dependencies.
const SeaweedPkg = "github.com/seaweedfs/seaweedfs/weed"

// SeaweedBinary returns the path of SeaweedFS's `weed`, building it when needed (several
// minutes cold on two cores: only opt-in tests use it).
func SeaweedBinary(t testing.TB) string {
	t.Helper()
	p, err := build("weed", SeaweedPkg, "tools/s3second/go.mod", false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// StartSeaweed starts SeaweedFS (`weed mini`: master, volume server, filer and S3
// gateway in one process) on free 127.0.0.1 ports with a temporary directory and one
// identity with random credentials, creates a bucket, and stops it when the test ends.
// The result is used like StartS3's.
func StartSeaweed(t testing.TB) *S3 {
	t.Helper()
	bin := SeaweedBinary(t)
	dir := t.TempDir()
	s := &S3{
		Region:    "us-east-1",
		AccessKey: "lchat-" + randHex(6),
		SecretKey: randHex(20),
		Root:      filepath.Join(dir, "data"),
		LogFile:   filepath.Join(dir, "weed.log"),
	}
	if err := os.Mkdir(s.Root, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := map[string]any{"identities": []any{map[string]any{
		"name":        "lchat",
		"credentials": []any{map[string]string{"accessKey": s.AccessKey, "secretKey": s.SecretKey}},
		"actions":     []string{"Admin", "Read", "Write", "List", "Tagging"},
	}}}
	raw, _ := json.Marshal(conf)
	confPath := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(confPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("weed log tail (%s):\n%s", s.LogFile, tail(s.LogFile, 60))
		}
	})
	if lastErr := s.startSeaweed(bin, confPath, freePorts(t, 12)); lastErr != nil {
		t.Fatalf("starting weed mini: %v\n%s", lastErr, tail(s.LogFile, 60))
	}
	s.Bucket = s.CreateBucket(t)
	s.waitWritable(t)
	return s
}

// freePorts returns n distinct ports, each reserved until the test ends (FreePort).
func freePorts(t testing.TB, n int) []int {
	ports := make([]int, n)
	for i := range ports {
		ports[i], _ = strconv.Atoi(FreePort(t, "127.0.0.1"))
	}
	return ports
}

func (s *S3) startSeaweed(bin, confPath string, p []int) error {
	s.Endpoint = fmt.Sprintf("http://127.0.0.1:%d", p[0])
	logf, err := os.OpenFile(s.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	port := func(i int) string { return strconv.Itoa(p[i]) }
	args := []string{"mini",
		"-dir=" + s.Root, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-s3.port=" + port(0), "-s3.port.grpc=" + port(1),
		"-master.port=" + port(2), "-master.port.grpc=" + port(3),
		"-volume.port=" + port(4), "-volume.port.grpc=" + port(5),
		"-filer.port=" + port(6), "-filer.port.grpc=" + port(7),
		"-webdav=false", "-webdav.port=" + port(8),
		"-admin.ui=false", "-admin.port=" + port(9), "-admin.port.grpc=" + port(10), "-admin.port.legacy=0",
		"-debug.port=" + port(11),
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-s3.config=" + confPath,
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = filepath.Dir(s.Root)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.watch(cmd)
	client, err := s.rawClient()
	if err != nil {
		return err
	}
	return s.waitReady("weed", 90*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := client.ListBuckets(ctx, &s3.ListBucketsInput{})
		return err
	})
}

// waitWritable waits until a put into the bucket succeeds: the volume server registers
// with the master a moment after the gateway answers.
func (s *S3) waitWritable(t testing.TB) {
	t.Helper()
	client := s.Client(t)
	var lastErr error
	WaitFor(t, 90*time.Second, "weed's bucket "+s.Bucket+" to be writable", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, lastErr = client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(s.Bucket), Key: aws.String("probe"), Body: bytes.NewReader([]byte("probe"))})
		if lastErr == nil {
			_, lastErr = client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.Bucket), Key: aws.String("probe")})
		}
		return lastErr == nil
	}, func() string { return fmt.Sprintf("last error: %v", lastErr) })
}
