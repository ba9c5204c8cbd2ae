// Package buckets holds the lchat.buckets.* guest modules, the object stores the lchat
// app and the certificate storage keep their state in, and the `bucket-check` command.
// A host module loads one with a `caddy:"namespace=lchat.buckets inline_key=backend"`
// field and type-asserts bucket.Bucket:
//
//	"bucket": {"backend": "s3", "bucket": "lchat-state", "prefix": "prod", "region": "eu-west-1"}
//	"bucket": {"backend": "file", "root": "/var/lib/lchat/bucket"}
package buckets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/bucket/s3bucket"
)

func init() {
	caddy.RegisterModule(S3{})
	caddy.RegisterModule(File{})
}

// S3 is the `lchat.buckets.s3` module: a bucket on S3 or an S3-compatible store.
// Every field takes placeholders, such as {env.LCHAT_HIBERNATE_BUCKET}; credentials
// left empty come from the standard AWS chain (environment, shared config, role).
type S3 struct {
	// Bucket is the bucket name. Required.
	Bucket string `json:"bucket,omitempty"`
	// Prefix is prepended, with a slash, to every key. Default: none.
	Prefix string `json:"prefix,omitempty"`
	// Region signs requests. Default: AWS_REGION, else us-east-1.
	Region string `json:"region,omitempty"`
	// Endpoint is an S3-compatible endpoint, http(s)://host[:port]. Default: AWS S3
	// (or AWS_ENDPOINT_URL_S3 when set).
	Endpoint string `json:"endpoint,omitempty"`
	// UsePathStyle addresses buckets as host/bucket (most S3-compatible stores need
	// it). Default: true when an endpoint is configured (Endpoint, or
	// AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL), else false (AWS's virtual-hosted style).
	UsePathStyle bool `json:"use_path_style,omitempty"`
	// VirtualHost keeps virtual-hosted style even with an endpoint. Default: false.
	VirtualHost bool `json:"virtual_host,omitempty"`
	// AccessKeyID, SecretAccessKey and SessionToken are static credentials; use
	// placeholders rather than literal secrets. Default: the AWS credentials chain.
	AccessKeyID     string `json:"access_key_id,omitempty"`
	SecretAccessKey string `json:"secret_access_key,omitempty"`
	SessionToken    string `json:"session_token,omitempty"`

	backend // an s3bucket, or a filebucket when Bucket is file:///path
}

// CaddyModule returns the Caddy module information.
func (S3) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "lchat.buckets.s3",
		New: func() caddy.Module { return new(S3) },
	}
}

func (s *S3) config() s3bucket.Config {
	return s3bucket.Config{
		Bucket: s.Bucket, Prefix: s.Prefix, Region: s.Region, Endpoint: s.Endpoint, UsePathStyle: s.UsePathStyle,
		AccessKeyID: s.AccessKeyID, SecretAccessKey: s.SecretAccessKey, SessionToken: s.SessionToken,
		QuietSDK: quietSDK,
	}
}

// quietSDK drops the AWS SDK's own log lines; bucket-check sets it (command.go).
var quietSDK bool

// Provision expands placeholders, checks the configuration and builds the client.
// It does not contact the store; `lchat-caddy bucket-check` does.
func (s *S3) Provision(ctx caddy.Context) error {
	repl := caddy.NewReplacer()
	for _, f := range []*string{&s.Bucket, &s.Prefix, &s.Region, &s.Endpoint, &s.AccessKeyID, &s.SecretAccessKey, &s.SessionToken} {
		*f = repl.ReplaceAll(*f, "")
	}
	if strings.HasPrefix(s.Bucket, "file:") {
		// LCHAT_HIBERNATE_BUCKET=file:///path selects the embedded local store, so one
		// Caddyfile serves both a real S3 deployment and a single machine.
		root, err := fileBucketRoot(s.Bucket)
		if err != nil {
			return fmt.Errorf("lchat.buckets.s3: bucket: %v", err)
		}
		f := &File{Root: root, Prefix: s.Prefix}
		if err := f.Provision(ctx); err != nil {
			return err
		}
		s.backend = f.backend
		return nil
	}
	if s.UsePathStyle && s.VirtualHost {
		return errors.New("lchat.buckets.s3: use_path_style and virtual_host exclude each other")
	}
	// A custom endpoint is nearly always an S3-compatible store that needs path style;
	// bucket-check makes the same choice, so it tests what the server will do.
	if !s.VirtualHost && (s.Endpoint != "" || os.Getenv("AWS_ENDPOINT_URL_S3") != "" || os.Getenv("AWS_ENDPOINT_URL") != "") {
		s.UsePathStyle = true
	}
	if err := s.Validate(); err != nil {
		return err
	}
	b, err := s3bucket.New(ctx, s.config())
	if err != nil {
		return fmt.Errorf("lchat.buckets.s3: %v", err)
	}
	s.bkt = b
	return nil
}

// Validate names the field at fault; it never echoes a credential.
func (s *S3) Validate() error {
	if err := s.config().Validate(); err != nil {
		return fmt.Errorf("lchat.buckets.s3: %v", err)
	}
	return nil
}

// File is the `lchat.buckets.file` module: a bucket in a local directory, shared
// safely by the processes of one machine. It is the embedded default for one box.
type File struct {
	// Root is the directory. Default: `lchat/bucket` in Caddy's data directory.
	Root string `json:"root,omitempty"`
	// Prefix is a subdirectory of Root the keys live under. Default: none.
	Prefix string `json:"prefix,omitempty"`

	backend
}

// CaddyModule returns the Caddy module information.
func (File) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "lchat.buckets.file",
		New: func() caddy.Module { return new(File) },
	}
}

// Provision expands placeholders, applies the default root and opens (creating) it.
func (f *File) Provision(ctx caddy.Context) error {
	repl := caddy.NewReplacer()
	f.Root = repl.ReplaceAll(f.Root, "")
	f.Prefix = repl.ReplaceAll(f.Prefix, "")
	if f.Root == "" {
		f.Root = filepath.Join(caddy.AppDataDir(), "lchat", "bucket")
	}
	if err := f.Validate(); err != nil {
		return err
	}
	b, err := filebucket.New(f.Root)
	if err != nil {
		return fmt.Errorf("lchat.buckets.file: root: %v", err)
	}
	if b, err = b.Sub(f.Prefix); err != nil {
		return fmt.Errorf("lchat.buckets.file: prefix: %v", err)
	}
	f.bkt = b
	return nil
}

// Validate checks the fields that do not need the filesystem.
func (f *File) Validate() error {
	if f.Root == "" {
		return errors.New("lchat.buckets.file: root is required")
	}
	if _, err := bucket.CleanPrefix(f.Prefix); err != nil {
		return fmt.Errorf("lchat.buckets.file: %v", err)
	}
	return nil
}

var errNotProvisioned = errors.New("bucket module used before Provision")

// backend is the bucket a module built in Provision. Embedded in S3 and File, it gives
// them the bucket.Bucket methods (String aside), each failing until Provision has run.
type backend struct {
	bkt bucket.Bucket
}

// Get streams an object, through the backend built in Provision.
func (b backend) Get(ctx context.Context, key string) (*bucket.Object, error) {
	if b.bkt == nil {
		return nil, errNotProvisioned
	}
	return b.bkt.Get(ctx, key)
}

// Head returns an object's metadata, through the backend built in Provision.
func (b backend) Head(ctx context.Context, key string) (bucket.Info, error) {
	if b.bkt == nil {
		return bucket.Info{}, errNotProvisioned
	}
	return b.bkt.Head(ctx, key)
}

// Put stores body under key, streaming it, through the backend built in Provision.
func (b backend) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if b.bkt == nil {
		return bucket.Info{}, errNotProvisioned
	}
	return b.bkt.Put(ctx, key, body, size, cond)
}

// Delete removes key, through the backend built in Provision.
func (b backend) Delete(ctx context.Context, key string, cond bucket.Cond) error {
	if b.bkt == nil {
		return errNotProvisioned
	}
	return b.bkt.Delete(ctx, key, cond)
}

// List returns one page of the keys under prefix, through the backend built in Provision.
func (b backend) List(ctx context.Context, prefix, token string) (bucket.ListPage, error) {
	if b.bkt == nil {
		return bucket.ListPage{}, errNotProvisioned
	}
	return b.bkt.List(ctx, prefix, token)
}

// Copy copies src to dst within the bucket, through the backend built in Provision.
func (b backend) Copy(ctx context.Context, src, dst string) (bucket.Info, error) {
	if b.bkt == nil {
		return bucket.Info{}, errNotProvisioned
	}
	return b.bkt.Copy(ctx, src, dst)
}

// String describes the bucket without credentials.
func (s *S3) String() string {
	if s.bkt == nil {
		return "s3://" + s.Bucket
	}
	return s.bkt.String()
}

// String describes the bucket as a file URL.
func (f *File) String() string {
	if f.bkt == nil {
		return "file://" + f.Root
	}
	return f.bkt.String()
}

// Interface guards
var (
	_ caddy.Provisioner = (*S3)(nil)
	_ caddy.Validator   = (*S3)(nil)
	_ bucket.Bucket     = (*S3)(nil)
	_ caddy.Provisioner = (*File)(nil)
	_ caddy.Validator   = (*File)(nil)
	_ bucket.Bucket     = (*File)(nil)
)

// fileBucketRoot returns the directory of a file:///absolute/path bucket URL.
func fileBucketRoot(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Path == "" || !filepath.IsAbs(u.Path) || (u.Host != "" && u.Host != "localhost") {
		return "", fmt.Errorf("a file bucket is file:///absolute/path, got %q", raw)
	}
	return u.Path, nil
}
