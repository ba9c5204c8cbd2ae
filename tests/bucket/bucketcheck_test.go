package bucket_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// bucketCheck runs the real `lchat-caddy bucket-check` with only env (plus PATH and
// HOME) in its environment, and returns its combined output and exit code.
func bucketCheck(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(harness.Binary(t), append([]string{"bucket-check"}, args...)...)
	home := t.TempDir()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_DATA_HOME=" + home, "XDG_CONFIG_HOME=" + home}, env...)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running bucket-check: %v", err)
	}
	return string(out), code
}

// assertClean fails when the bucket holds any key under prefix: the check's scratch
// keys must all be gone.
func assertClean(t *testing.T, b bucket.Bucket) {
	t.Helper()
	page, err := b.List(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Objects) != 0 {
		t.Errorf("bucket-check left %d objects behind, first %s", len(page.Objects), page.Objects[0].Key)
	}
}

// TestBucketCheckCommand drives `lchat-caddy bucket-check` as an operator would: from
// the environment the shipped Caddyfiles read, from flags, from a Caddyfile, and with
// configurations that cannot work. A passing store exits 0 with an OK verdict and one
// line per race; a check that cannot run exits 1 naming what is wrong; no output ever
// shows the secret.
func TestBucketCheckCommand(t *testing.T) {
	s3 := harness.StartS3(t)
	creds := []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey}

	passes := func(t *testing.T, out string, code, races int) {
		t.Helper()
		t.Log("\n" + out)
		if code != 0 {
			t.Fatalf("exit code %d, want 0", code)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if !strings.HasPrefix(lines[len(lines)-1], "OK: ") {
			t.Errorf("last line %q, want the OK verdict", lines[len(lines)-1])
		}
		if n := strings.Count(out, " ok\n"); n != races {
			t.Errorf("%d races reported ok, want %d", n, races)
		}
		if strings.Contains(out, s3.SecretKey) {
			t.Error("output shows the secret")
		}
	}

	t.Run("environment", func(t *testing.T) {
		out, code := bucketCheck(t, s3.Env("from-env"), "--racers", "8", "--rounds", "1")
		passes(t, out, code, 4)
		if !strings.Contains(out, "s3://"+s3.Bucket+"/from-env") {
			t.Errorf("output does not name the bucket and prefix from the environment")
		}
		assertClean(t, s3.NewBucket(t, "from-env"))
	})

	t.Run("flags", func(t *testing.T) {
		env := append([]string{"AWS_REGION=" + s3.Region}, creds...)
		out, code := bucketCheck(t, env, "--bucket", s3.Bucket, "--prefix", "from-flags", "--endpoint", s3.Endpoint, "--racers", "8", "--rounds", "2")
		passes(t, out, code, 8)
		assertClean(t, s3.NewBucket(t, "from-flags"))
	})

	t.Run("caddyfile", func(t *testing.T) {
		dir := t.TempDir()
		caddyfile := filepath.Join(dir, "Caddyfile")
		err := os.WriteFile(caddyfile, []byte(`{
	lchat {
		bucket s3 {
			bucket {env.LCHAT_HIBERNATE_BUCKET}
			prefix from-config
			endpoint {env.TEST_ENDPOINT}
			use_path_style
			access_key_id {env.TEST_KEY_ID}
			secret_access_key {env.TEST_SECRET}
		}
	}
}
`), 0o644)
		if err != nil {
			t.Fatal(err)
		}
		env := []string{"LCHAT_HIBERNATE_BUCKET=" + s3.Bucket, "TEST_ENDPOINT=" + s3.Endpoint, "TEST_KEY_ID=" + s3.AccessKey, "TEST_SECRET=" + s3.SecretKey}
		out, code := bucketCheck(t, env, "--config", caddyfile, "--adapter", "caddyfile", "--racers", "8", "--rounds", "1")
		passes(t, out, code, 4)
		assertClean(t, s3.NewBucket(t, "from-config"))
	})

	t.Run("file", func(t *testing.T) {
		dir := t.TempDir()
		out, code := bucketCheck(t, nil, "--bucket", "file://"+dir, "--racers", "8", "--rounds", "1")
		passes(t, out, code, 4)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != ".lchat-bucket" {
				t.Errorf("bucket-check left %s in the file bucket", e.Name())
			}
		}
	})

	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no bucket", creds, nil, "LCHAT_HIBERNATE_BUCKET"},
		{"malformed endpoint", creds, []string{"--bucket", s3.Bucket, "--endpoint", "127.0.0.1:9"}, "endpoint must be http(s)://host[:port]"},
		{"malformed endpoint in the environment", append([]string{"AWS_ENDPOINT_URL_S3=127.0.0.1:9"}, creds...), []string{"--bucket", s3.Bucket}, "endpoint must be http(s)://host[:port]"},
		{"wrong secret", []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=wrong-" + s3.SecretKey}, []string{"--bucket", s3.Bucket, "--endpoint", s3.Endpoint}, "writing a probe object"},
		{"missing bucket", creds, []string{"--bucket", "no-such-bucket", "--endpoint", s3.Endpoint}, "writing a probe object"},
		{"unwritable directory", nil, []string{"--bucket", "file:///proc/lchat-bucket-check"}, "lchat.buckets.file: root"},
		{"config without a bucket", nil, []string{"--config", writeFile(t, "{\"apps\":{}}")}, "no apps.lchat.bucket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := bucketCheck(t, tc.env, tc.args...)
			t.Log("\n" + out)
			if code != 1 {
				t.Errorf("exit code %d, want 1 (the check could not run)", code)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output does not contain %q", tc.want)
			}
			if strings.Contains(out, s3.SecretKey) {
				t.Error("output shows the secret")
			}
		})
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
