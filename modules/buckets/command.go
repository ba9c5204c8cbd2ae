package buckets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/check"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/bucket/s3bucket"
	"github.com/lchat/lchat-caddy/internal/cli"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "bucket-check",
		Usage: "[--bucket <name>|file:///<dir> [--create]] [--prefix <p>] [--region <r>] [--endpoint <url>] [--path-style] | --config <file> [--adapter <name>]",
		Short: "Proves that the bucket enforces conditional writes",
		Long: `
Races many If-None-Match creates of one key, many If-Match swaps from one ETag, many
If-Match writes to a missing key and many If-Match deletes with a stale ETag against
the bucket, under a scratch prefix (bucket-check/<random>/) that is removed afterwards,
and prints each race and a verdict. Leases, manifests and certificate locks are only
safe on a store where exactly one writer wins each create and swap and none wins on a
missing key or with a stale ETag; some S3-compatible stores accept the conditional
headers and ignore them.

The bucket comes from flags, with defaults from the environment
(LCHAT_HIBERNATE_BUCKET, LCHAT_HIBERNATE_PREFIX, AWS_ENDPOINT_URL_S3, AWS_REGION;
credentials from the standard AWS chain), or with --config from the lchat app's
"bucket" in a Caddy config (JSON, or any adapter such as the Caddyfile).
--bucket takes a bucket name, or file:///path for a local directory bucket, which
must exist (--create makes it). Nothing the check wrote stays behind: its scratch
keys, and in a directory bucket the lock and temporary files it needed.

Exit status: 0 when every race had the right winners, 2 when one did not,
1 when the check could not run, 4 when the input is bad (a bucket name or URL
refused before any request).`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().String("bucket", "", "bucket name, or file:///path (default $LCHAT_HIBERNATE_BUCKET)")
			cmd.Flags().String("prefix", "", "key prefix (default $LCHAT_HIBERNATE_PREFIX)")
			cmd.Flags().String("region", "", "S3 region (default $AWS_REGION)")
			cmd.Flags().String("endpoint", "", "S3-compatible endpoint http(s)://host[:port] (default $AWS_ENDPOINT_URL_S3)")
			cmd.Flags().Bool("path-style", false, "address the bucket path-style (default: on when an endpoint is set)")
			cmd.Flags().Bool("virtual-host", false, "address the bucket virtual-host style even with an endpoint")
			cmd.Flags().StringP("config", "c", "", "read the lchat app's bucket from this Caddy config file")
			cmd.Flags().StringP("adapter", "a", "", "name of the config adapter for --config")
			cmd.Flags().Bool("create", false, "create a file:/// bucket's directory when it does not exist")
			cmd.Flags().Int("racers", 32, "concurrent writers per race")
			cmd.Flags().Int("rounds", 3, "races of each kind")
			cli.Command(cmd, cobra.NoArgs, cmdBucketCheck)
		},
	})
}

// checkFlags are bucket-check's inputs, after environment defaults.
type checkFlags struct {
	Bucket, Prefix, Region, Endpoint string
	PathStyle, VirtualHost           bool
	Config, Adapter                  string
	Racers, Rounds                   int
	Create                           bool
}

func cmdBucketCheck(fl caddycmd.Flags) (int, error) {
	f := checkFlags{
		Bucket: fl.String("bucket"), Prefix: fl.String("prefix"), Region: fl.String("region"),
		Endpoint: fl.String("endpoint"), PathStyle: fl.Bool("path-style"), VirtualHost: fl.Bool("virtual-host"),
		Config: fl.String("config"), Adapter: fl.String("adapter"),
		Racers: fl.Int("racers"), Rounds: fl.Int("rounds"), Create: fl.Bool("create"),
	}
	// The SDK's own stderr lines (an IMDS fallback warning) would come before the one
	// error line that says what failed.
	quietSDK = true
	// A signal stops the races and the scratch keys are still removed: SIGPIPE too (the
	// output piped to a reader that quit), which would otherwise end the process at once.
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer stop()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: sigCtx})
	defer cancel()

	var (
		b   bucket.Bucket
		err error
	)
	var dir *fileDir
	if f.Config != "" {
		cfgJSON, _, _, lerr := caddycmd.LoadConfig(f.Config, f.Adapter)
		if lerr != nil {
			return caddy.ExitCodeFailedStartup, fmt.Errorf("loading config: %v", lerr)
		}
		// Before the module is loaded: loading a file bucket creates its directory.
		if root := configFileRoot(cfgJSON); root != "" {
			if dir, err = openFileDir(root, "the config's bucket root", f.Create); err != nil {
				return cli.ExitFailed, err
			}
		}
		b, err = bucketFromConfig(ctx, cfgJSON)
	} else {
		raw, from := f.Bucket, "--bucket"
		if raw == "" {
			raw, from = os.Getenv("LCHAT_HIBERNATE_BUCKET"), "$LCHAT_HIBERNATE_BUCKET"
		}
		if root, rerr := fileBucketRoot(raw); strings.HasPrefix(raw, "file:") && rerr == nil {
			if dir, err = openFileDir(root, from+" "+raw, f.Create); err != nil {
				return cli.ExitFailed, err
			}
		}
		b, err = bucketFromFlags(ctx, f, os.Getenv)
	}
	if dir != nil {
		// Whatever happens next, the directory keeps nothing of the check.
		defer dir.restore(os.Stdout)
	}
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	if s3b := s3Of(b); s3b != nil {
		if err := s3b.CheckCredentials(ctx); err != nil {
			return cli.ExitFailed, err
		}
	}
	rep, err := runCheck(ctx, b, os.Stdout, check.Options{Racers: f.Racers, Rounds: f.Rounds})
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	if !rep.OK() {
		return cli.ExitCheckFailed, nil
	}
	return caddy.ExitCodeSuccess, nil
}

// runCheck runs the races, printing each as it finishes and then the verdict.
func runCheck(ctx context.Context, b bucket.Bucket, out io.Writer, opts check.Options) (check.Report, error) {
	opts.Progress = func(line string) { fmt.Fprintln(out, line) }
	rep, err := check.Run(ctx, b, opts)
	if err != nil {
		return rep, fmt.Errorf("checking %s: %v", b, err)
	}
	if rep.CleanupError != "" {
		fmt.Fprintf(out, "warning: scratch keys under %s were not all removed: %s\n", rep.Scratch, rep.CleanupError)
	}
	fmt.Fprintln(out, rep.Verdict())
	return rep, nil
}

// bucketFromFlags builds the bucket the flags (or, where a flag is empty, the
// environment) describe, through the same modules a config would use.
func bucketFromFlags(ctx caddy.Context, f checkFlags, getenv func(string) string) (bucket.Bucket, error) {
	from := map[string]string{}
	def := func(v *string, flag, env string) {
		from[flag] = flag
		if *v == "" {
			*v = getenv(env)
			from[flag] = "$" + env
		}
	}
	def(&f.Bucket, "--bucket", "LCHAT_HIBERNATE_BUCKET")
	def(&f.Prefix, "--prefix", "LCHAT_HIBERNATE_PREFIX")
	def(&f.Region, "--region", "AWS_REGION")
	def(&f.Endpoint, "--endpoint", "AWS_ENDPOINT_URL_S3")
	if f.Bucket == "" {
		return nil, cli.Usagef("no bucket: pass --bucket or --config, or set LCHAT_HIBERNATE_BUCKET")
	}
	// Bad input is refused here, before any request: an S3 client given a bad name
	// would first walk the AWS credential chain (the instance metadata service
	// included) and then fail on the request.
	if err := checkBucketFlags(f, from); err != nil {
		return nil, cli.Usage(err)
	}
	var mod interface {
		caddy.Provisioner
		caddy.Validator
		bucket.Bucket
	}
	if strings.HasPrefix(f.Bucket, "file:") {
		root, _ := fileBucketRoot(f.Bucket) // checked by checkBucketFlags
		mod = &File{Root: root, Prefix: f.Prefix}
	} else {
		mod = &S3{
			Bucket: f.Bucket, Prefix: f.Prefix, Region: f.Region, Endpoint: f.Endpoint,
			// Path style by default with an endpoint, exactly as the server decides.
			UsePathStyle: f.PathStyle, VirtualHost: f.VirtualHost,
		}
	}
	if err := mod.Provision(ctx); err != nil {
		return nil, err
	}
	if err := mod.Validate(); err != nil {
		return nil, err
	}
	return mod, nil
}

// checkBucketFlags refuses a bucket, prefix or endpoint no request could succeed
// with; from names where each value came from (the flag or its variable).
func checkBucketFlags(f checkFlags, from map[string]string) error {
	if scheme, _, ok := strings.Cut(f.Bucket, ":"); ok {
		switch {
		case scheme == "file":
			if _, err := fileBucketRoot(f.Bucket); err != nil {
				return fmt.Errorf("%s: %v", from["--bucket"], err)
			}
		case scheme == "s3":
			name, _, _ := strings.Cut(strings.TrimPrefix(f.Bucket, "s3://"), "/")
			return fmt.Errorf("%s %q: give the S3 bucket's name alone (%s), its prefix with --prefix", from["--bucket"], f.Bucket, name)
		default:
			return fmt.Errorf("%s %q: not a bucket name, and %q is not a bucket URL scheme (file:///path is the only one)", from["--bucket"], f.Bucket, scheme+":")
		}
	} else if err := s3bucket.ValidateBucketName(f.Bucket); err != nil {
		return fmt.Errorf("%s: %v", from["--bucket"], err)
	}
	if _, err := bucket.CleanPrefix(f.Prefix); err != nil {
		return fmt.Errorf("%s: %v", from["--prefix"], err)
	}
	if f.Endpoint != "" {
		u, err := url.Parse(f.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%s %q: endpoint must be http(s)://host[:port]", from["--endpoint"], f.Endpoint)
		}
	}
	return nil
}

// bucketFromConfig loads the lchat app's bucket module from a Caddy JSON config,
// reading only apps.lchat.bucket.
func bucketFromConfig(ctx caddy.Context, cfgJSON []byte) (bucket.Bucket, error) {
	var cfg struct {
		Apps struct {
			Lchat struct {
				Bucket json.RawMessage `json:"bucket"`
			} `json:"lchat"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		return nil, fmt.Errorf("reading config: %v", err)
	}
	if len(cfg.Apps.Lchat.Bucket) == 0 {
		return nil, errors.New("config has no apps.lchat.bucket (the lchat app then uses its embedded file bucket; check it with --bucket file:///path)")
	}
	holder := struct {
		BucketRaw json.RawMessage `json:"bucket,omitempty" caddy:"namespace=lchat.buckets inline_key=backend"`
	}{BucketRaw: cfg.Apps.Lchat.Bucket}
	mod, err := ctx.LoadModule(&holder, "BucketRaw")
	if err != nil {
		return nil, fmt.Errorf("loading apps.lchat.bucket: %v", err)
	}
	b, ok := mod.(bucket.Bucket)
	if !ok {
		return nil, fmt.Errorf("apps.lchat.bucket: module %T is not a bucket", mod)
	}
	return b, nil
}

// fileDir is a directory bucket as bucket-check found it, so that it leaves nothing
// behind: the bucket's lock and temporary files (filebucket.MetaDir) are removed unless
// they were there before; a directory made by --create stays (it was asked for).
type fileDir struct {
	root        string
	metaExisted bool
}

// openFileDir checks that root exists as a directory (from names where it came from),
// or creates it with create, saying so.
func openFileDir(root, from string, create bool) (*fileDir, error) {
	fi, err := os.Stat(root)
	switch {
	case errors.Is(err, fs.ErrNotExist) && create:
		if err := os.MkdirAll(root, 0o700); err != nil {
			return nil, fmt.Errorf("--create: %v", err)
		}
		fmt.Printf("created %s (--create)\n", root)
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s: directory %s does not exist (bucket-check checks an existing bucket; --create makes it)", from, root)
	case err != nil:
		return nil, fmt.Errorf("%s: %v", from, err)
	case !fi.IsDir():
		return nil, fmt.Errorf("%s: %s is not a directory", from, root)
	}
	_, err = os.Lstat(filepath.Join(root, filebucket.MetaDir))
	return &fileDir{root: root, metaExisted: err == nil}, nil
}

// restore removes the lock and temporary files the check made, when it made them.
func (d *fileDir) restore(out io.Writer) {
	if d.metaExisted {
		return
	}
	if err := os.RemoveAll(filepath.Join(d.root, filebucket.MetaDir)); err != nil {
		fmt.Fprintf(out, "warning: the check's lock files under %s were not all removed: %v\n", d.root, err)
	}
}

// configFileRoot is the directory of a config's file bucket (backend "file", or an s3
// bucket named file:///path), "" for any other.
func configFileRoot(cfgJSON []byte) string {
	var cfg struct {
		Apps struct {
			Lchat struct {
				Bucket struct {
					Backend string `json:"backend"`
					Root    string `json:"root"`
					Bucket  string `json:"bucket"`
				} `json:"bucket"`
			} `json:"lchat"`
		} `json:"apps"`
	}
	if json.Unmarshal(cfgJSON, &cfg) != nil {
		return ""
	}
	repl := caddy.NewReplacer()
	bk := cfg.Apps.Lchat.Bucket
	switch bk.Backend {
	case "file":
		return repl.ReplaceAll(bk.Root, "")
	case "s3":
		if root, err := fileBucketRoot(repl.ReplaceAll(bk.Bucket, "")); err == nil {
			return root
		}
	}
	return ""
}

// s3Of is the S3 client under a bucket module, nil for a file bucket.
func s3Of(b bucket.Bucket) *s3bucket.Bucket {
	if m, ok := b.(*S3); ok {
		if c, ok := m.bkt.(*s3bucket.Bucket); ok {
			return c
		}
	}
	return nil
}
