// Package s3bucket is a bucket.Bucket on S3 or an S3-compatible store, through
// aws-sdk-go-v2. Conditional writes are the store's own: PutObject and
// CompleteMultipartUpload with If-None-Match / If-Match, DeleteObject with If-Match.
// Whether a store enforces them atomically is what `lchat-caddy bucket-check` tests.
package s3bucket

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/s3/manager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/lchat/lchat-caddy/bucket"
)

// DefaultRegion is the region used when neither Config.Region nor the environment
// (AWS_REGION, shared config) names one. S3-compatible stores usually ignore it, but
// requests must be signed for some region.
const DefaultRegion = "us-east-1"

const (
	// singlePartMax is the largest body sent as one PutObject. A body of unknown size
	// is buffered up to this much to find out; anything larger goes multipart with
	// partSize buffers, so memory stays bounded whatever the object size.
	singlePartMax = 5 << 20
	partSize      = 5 << 20
	// partConcurrency bounds the parts in flight (and buffered) per upload.
	partConcurrency = 2
	// condSinglePutMax is the largest body a conditional write sends in one
	// PutObject. Larger conditional bodies are uploaded as parts and the condition
	// rides on CompleteMultipartUpload: a store that answers 412 before reading a big
	// body and then resets the connection (versitygw does) would otherwise turn a lost
	// race into a transport error instead of ErrPreconditionFailed.
	condSinglePutMax = 256 << 10
)

// Config selects a bucket. The zero value of every optional field means "from the
// standard AWS configuration chain" (environment, shared config, instance role).
type Config struct {
	// Bucket is the bucket name. Required.
	Bucket string
	// Prefix is prepended, with a slash, to every key. Default: none.
	Prefix string
	// Region signs requests. Default: AWS_REGION / shared config, else us-east-1.
	Region string
	// Endpoint is an S3-compatible endpoint, http(s)://host[:port]. Default: AWS S3,
	// or AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL when set.
	Endpoint string
	// UsePathStyle addresses the bucket as a path (host/bucket/key) instead of a
	// virtual host (bucket.host/key); most S3-compatible stores need it.
	UsePathStyle bool
	// AccessKeyID, SecretAccessKey and SessionToken are static credentials. Default:
	// the standard credentials chain.
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// QuietSDK drops the AWS SDK's own log lines, which it writes to stderr as plain text
	// ("WARN falling back to IMDSv1 ..."): bucket-check's one error line says it instead.
	QuietSDK bool `json:"-"`
}

// Validate checks the configuration; errors name the config field (in the
// snake_case of the lchat.buckets.s3 module) and never include credentials.
func (c Config) Validate() error {
	if strings.TrimSpace(c.Bucket) == "" {
		return errors.New("bucket is required")
	}
	if _, err := bucket.CleanPrefix(c.Prefix); err != nil {
		return err
	}
	if c.Endpoint != "" {
		if err := checkEndpoint(c.Endpoint); err != nil {
			return err
		}
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return errors.New("access_key_id and secret_access_key must be set together")
	}
	if c.SessionToken != "" && c.AccessKeyID == "" {
		return errors.New("session_token needs access_key_id and secret_access_key")
	}
	return nil
}

func checkEndpoint(ep string) error {
	const want = "endpoint must be http(s)://host[:port]"
	u, err := url.Parse(ep)
	if err != nil {
		return errors.New(want) // the parse error would echo the value
	}
	shown := u.Redacted()
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%s, got scheme %q in %s", want, u.Scheme, shown)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("%s, got no host in %s", want, shown)
	case u.User != nil:
		return fmt.Errorf("%s, without user info (credentials go in access_key_id/secret_access_key)", want)
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("%s, with no path, query or fragment: %s", want, shown)
	}
	return nil
}

// checkEnvEndpoint checks the endpoint the AWS SDK would take from the environment,
// so a malformed one stops start-up naming the variable instead of failing every
// request later.
func checkEnvEndpoint(getenv func(string) string) error {
	if strings.EqualFold(getenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"), "true") {
		return nil
	}
	for _, name := range []string{"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"} {
		if v := getenv(name); v != "" {
			if err := checkEndpoint(v); err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			return nil // the service-specific variable wins over the general one
		}
	}
	return nil
}

// Bucket is an S3 bucket (or a prefix within one).
type Bucket struct {
	client   *s3.Client
	uploader *manager.Uploader
	bucket   string
	prefix   string // cleaned: "" or without surrounding slashes
	desc     string // for String; holds no credentials
}

// New validates cfg and builds a client. It does not contact the store.
func New(ctx context.Context, cfg Config) (*Bucket, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("s3bucket: %v", err)
	}
	if cfg.Endpoint == "" {
		if err := checkEnvEndpoint(os.Getenv); err != nil {
			return nil, fmt.Errorf("s3bucket: %v", err)
		}
	}
	prefix, _ := bucket.CleanPrefix(cfg.Prefix)
	opts := []func(*config.LoadOptions) error{
		// Plain PutObject bodies we send are seekable, so a checksum is only added where
		// S3 requires one; some S3-compatible stores reject the aws-chunked trailers
		// the newer default adds to every upload.
		config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)))
	}
	if cfg.QuietSDK {
		opts = append(opts, config.WithLogger(logging.Nop{}))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3bucket: loading AWS configuration: %v", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = DefaultRegion
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(strings.TrimSuffix(cfg.Endpoint, "/"))
		}
		o.UsePathStyle = cfg.UsePathStyle
		o.DisableLogOutputChecksumValidationSkipped = true
		// The standard retryer's client-side retry quota (500 tokens, 5-10 a retry) is
		// shared by every request of the process: a burst of resets after a network
		// fault drains it, and from then on no request is retried at all until
		// successes refill it, so one transient reset fails a lease read or a
		// relocation outright (seen in the fault campaign: "retry quota exceeded, 3
		// available"). The box is the store's only client of these keys and bounds its
		// own work; keep the attempts and backoff, drop the quota.
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) { so.RateLimiter = ratelimit.None })
	})
	uploader := manager.NewUploader(client, func(u *manager.Uploader) {
		u.PartSize = partSize
		u.Concurrency = partConcurrency
	})
	desc := "s3://" + cfg.Bucket
	if prefix != "" {
		desc += "/" + prefix
	}
	if cfg.Endpoint != "" {
		if u, err := url.Parse(cfg.Endpoint); err == nil {
			desc += " at " + u.Redacted()
		}
	}
	return &Bucket{client: client, uploader: uploader, bucket: cfg.Bucket, prefix: prefix, desc: desc}, nil
}

// String describes the bucket: s3://bucket/prefix and the endpoint, no credentials.
func (b *Bucket) String() string { return b.desc }

// Client is the underlying S3 client, for tools that need more than the interface.
func (b *Bucket) Client() *s3.Client { return b.client }

func (b *Bucket) full(key string) (string, error) {
	if err := bucket.CheckKey(key); err != nil {
		return "", fmt.Errorf("s3bucket: %w", err)
	}
	return bucket.JoinPrefix(b.prefix, key), nil
}

func (b *Bucket) rel(full string) string {
	if b.prefix == "" {
		return full
	}
	return strings.TrimPrefix(full, b.prefix+"/")
}

// mapErr turns S3 errors into the bucket package's typed errors.
func mapErr(op, key string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("s3bucket: %s %s: %w", op, key, err)
	}
	status := 0
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	code := ""
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	switch {
	case status == http.StatusPreconditionFailed || code == "PreconditionFailed":
		return fmt.Errorf("s3bucket: %s %s: %w", op, key, bucket.ErrPreconditionFailed)
	case code == "ConditionalRequestConflict" || (status == http.StatusConflict && code != "BucketAlreadyExists" && code != "BucketAlreadyOwnedByYou"):
		return fmt.Errorf("s3bucket: %s %s: %w (%s)", op, key, bucket.ErrConflict, code)
	case code == "NoSuchKey" || (status == http.StatusNotFound && code != "NoSuchBucket" && code != "NoSuchUpload"):
		return fmt.Errorf("s3bucket: %s %s: %w", op, key, bucket.ErrNotFound)
	}
	return fmt.Errorf("s3bucket: %s %s: %w", op, key, err)
}

// responseDate is the store's clock from a response's Date header, or zero.
func responseDate(md middleware.Metadata) time.Time {
	if resp, ok := awsmiddleware.GetRawResponse(md).(*smithyhttp.Response); ok {
		if t, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
			return t
		}
	}
	return time.Time{}
}

// Get streams an object.
func (b *Bucket) Get(ctx context.Context, key string) (*bucket.Object, error) {
	full, err := b.full(key)
	if err != nil {
		return nil, err
	}
	out, err := b.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &full})
	if err != nil {
		return nil, mapErr("getting", key, err)
	}
	return &bucket.Object{
		Info: bucket.Info{Key: key, Size: aws.ToInt64(out.ContentLength), ETag: aws.ToString(out.ETag), LastModified: aws.ToTime(out.LastModified)},
		Body: out.Body,
	}, nil
}

// Head returns an object's metadata.
func (b *Bucket) Head(ctx context.Context, key string) (bucket.Info, error) {
	full, err := b.full(key)
	if err != nil {
		return bucket.Info{}, err
	}
	out, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.bucket, Key: &full})
	if err != nil {
		return bucket.Info{}, mapErr("heading", key, err)
	}
	return bucket.Info{Key: key, Size: aws.ToInt64(out.ContentLength), ETag: aws.ToString(out.ETag), LastModified: aws.ToTime(out.LastModified)}, nil
}

// Put stores body. Bodies up to 5 MiB go as one PutObject (one-part multipart when
// conditional and over 256 KiB, see condSinglePutMax); larger (or longer than it turned
// out) ones as a multipart upload whose completion carries the condition, so neither
// path holds more than a few parts in memory. A body that is not size bytes long (when
// size >= 0) fails the upload before it completes: nothing is stored. The returned LastModified is
// the store's Date for the completing request (S3 does not return LastModified on
// writes; it agrees with a later Head to the second).
func (b *Bucket) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	full, err := b.full(key)
	if err != nil {
		return bucket.Info{}, err
	}
	var ifMatch, ifNoneMatch *string
	if cond.IfMatch != "" {
		ifMatch = aws.String(cond.IfMatch)
	}
	if cond.IfNoneMatch {
		ifNoneMatch = aws.String("*")
	}

	limit := int64(singlePartMax)
	if size >= 0 && size <= singlePartMax {
		limit = size
	}
	var buf bytes.Buffer
	if size >= 0 && size <= singlePartMax {
		buf.Grow(int(size) + bytes.MinRead)
	}
	n, err := io.Copy(&buf, io.LimitReader(body, limit+1))
	if err != nil {
		return bucket.Info{}, fmt.Errorf("s3bucket: reading body of %s: %w", key, err)
	}
	if n <= limit && n <= singlePartMax {
		if size >= 0 && n != size {
			return bucket.Info{}, fmt.Errorf("s3bucket: putting %s: body had %d bytes, expected %d", key, n, size)
		}
		conditional := ifMatch != nil || ifNoneMatch != nil
		if conditional && n > condSinglePutMax {
			return b.putOnePart(ctx, key, full, buf.Bytes(), ifMatch, ifNoneMatch)
		}
		out, err := b.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket: &b.bucket, Key: &full, Body: bytes.NewReader(buf.Bytes()), ContentLength: aws.Int64(n),
			IfMatch: ifMatch, IfNoneMatch: ifNoneMatch,
		})
		if err != nil {
			return bucket.Info{}, putErr(key, cond, err)
		}
		return bucket.Info{Key: key, Size: n, ETag: aws.ToString(out.ETag), LastModified: responseDate(out.ResultMetadata)}, nil
	}
	if size >= 0 && size <= singlePartMax {
		return bucket.Info{}, fmt.Errorf("s3bucket: putting %s: body is longer than the expected %d bytes", key, size)
	}

	var rest io.Reader = io.MultiReader(&buf, body)
	if size >= 0 {
		rest = &exactReader{r: rest, left: size, key: key, size: size}
	}
	counted := &countingReader{r: rest}
	var rec dateRecorder
	out, err := b.uploader.Upload(ctx, &s3.PutObjectInput{
		Bucket: &b.bucket, Key: &full, Body: counted,
		IfMatch: ifMatch, IfNoneMatch: ifNoneMatch,
	}, func(u *manager.Uploader) {
		u.ClientOptions = append(u.ClientOptions, rec.option)
	})
	if err != nil {
		return bucket.Info{}, putErr(key, cond, err)
	}
	return bucket.Info{Key: key, Size: counted.n, ETag: aws.ToString(out.ETag), LastModified: rec.last()}, nil
}

// putOnePart stores data as a one-part multipart upload whose completion carries the
// condition (see condSinglePutMax). A failed upload is aborted.
func (b *Bucket) putOnePart(ctx context.Context, key, full string, data []byte, ifMatch, ifNoneMatch *string) (bucket.Info, error) {
	created, err := b.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &b.bucket, Key: &full})
	if err != nil {
		return bucket.Info{}, mapErr("putting", key, err)
	}
	abort := func() {
		// Best effort, detached from a possibly cancelled ctx.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		b.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &b.bucket, Key: &full, UploadId: created.UploadId})
	}
	part, err := b.client.UploadPart(ctx, &s3.UploadPartInput{
		Bucket: &b.bucket, Key: &full, UploadId: created.UploadId, PartNumber: aws.Int32(1),
		Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
	})
	if err != nil {
		abort()
		return bucket.Info{}, mapErr("putting", key, err)
	}
	out, err := b.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &b.bucket, Key: &full, UploadId: created.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: []types.CompletedPart{{ETag: part.ETag, PartNumber: aws.Int32(1)}}},
		IfMatch:         ifMatch, IfNoneMatch: ifNoneMatch,
	})
	if err != nil {
		abort()
		return bucket.Info{}, putErr(key, bucket.Cond{IfMatch: aws.ToString(ifMatch)}, err)
	}
	return bucket.Info{Key: key, Size: int64(len(data)), ETag: aws.ToString(out.ETag), LastModified: responseDate(out.ResultMetadata)}, nil
}

// putErr maps a put's error. S3 answers If-Match on a missing key with 404 NoSuchKey;
// for the caller that is a lost compare-and-swap like any other.
func putErr(key string, cond bucket.Cond, err error) error {
	err = mapErr("putting", key, err)
	if cond.IfMatch != "" && errors.Is(err, bucket.ErrNotFound) {
		return fmt.Errorf("s3bucket: putting %s: If-Match on a missing key: %w", key, bucket.ErrPreconditionFailed)
	}
	return err
}

// exactReader fails a read that would go past size bytes or ends before them, so
// the uploader aborts instead of completing an object of the wrong length.
type exactReader struct {
	r    io.Reader
	left int64
	key  string
	size int64
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left == 0 {
		var one [1]byte
		n, err := e.r.Read(one[:])
		switch {
		case n > 0:
			return 0, fmt.Errorf("s3bucket: putting %s: body is longer than the expected %d bytes", e.key, e.size)
		case err != nil:
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		return n, fmt.Errorf("s3bucket: putting %s: body ended %d bytes short of the expected %d: %w", e.key, e.left, e.size, io.ErrUnexpectedEOF)
	}
	return n, err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// dateRecorder keeps the Date header of the latest response of a multi-request
// operation (the multipart completion comes last).
type dateRecorder struct {
	mu sync.Mutex
	t  time.Time
}

func (d *dateRecorder) last() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.t
}

func (d *dateRecorder) option(o *s3.Options) {
	o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
		return stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc("lchatRecordDate",
			func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleDeserialize(ctx, in)
				if resp, ok := out.RawResponse.(*smithyhttp.Response); ok {
					if t, perr := http.ParseTime(resp.Header.Get("Date")); perr == nil {
						d.mu.Lock()
						if t.After(d.t) {
							d.t = t
						}
						d.mu.Unlock()
					}
				}
				return out, md, err
			}), middleware.After)
	})
}

// Delete removes key; with cond.IfMatch the store checks the ETag (DeleteObject
// If-Match). A missing key under If-Match is ErrPreconditionFailed, as the interface
// promises. Stores differ there (AWS answers 404, versitygw 204), so a conditional
// delete first HEADs the key: missing is ErrPreconditionFailed; present, the delete
// itself carries If-Match, so the store still refuses to remove any other version.
// The one imprecision: if another client deletes the key between the HEAD and the
// DELETE, this call reports success (the key is gone either way).
func (b *Bucket) Delete(ctx context.Context, key string, cond bucket.Cond) error {
	full, err := b.full(key)
	if err != nil {
		return err
	}
	in := &s3.DeleteObjectInput{Bucket: &b.bucket, Key: &full}
	if cond.IfMatch != "" {
		if _, err := b.Head(ctx, key); err != nil {
			if errors.Is(err, bucket.ErrNotFound) {
				return fmt.Errorf("s3bucket: deleting %s: If-Match on a missing key: %w", key, bucket.ErrPreconditionFailed)
			}
			return err
		}
		in.IfMatch = aws.String(cond.IfMatch)
	}
	if _, err := b.client.DeleteObject(ctx, in); err != nil {
		err = mapErr("deleting", key, err)
		if errors.Is(err, bucket.ErrNotFound) {
			if cond.IfMatch != "" {
				return fmt.Errorf("s3bucket: deleting %s: If-Match on a missing key: %w", key, bucket.ErrPreconditionFailed)
			}
			return nil
		}
		return err
	}
	return nil
}

// Copy copies src to dst on the store (no bytes through this process). The copy is
// made conditional on the source ETag read first, so the returned size is the copy's.
func (b *Bucket) Copy(ctx context.Context, src, dst string) (bucket.Info, error) {
	fullSrc, err := b.full(src)
	if err != nil {
		return bucket.Info{}, err
	}
	fullDst, err := b.full(dst)
	if err != nil {
		return bucket.Info{}, err
	}
	info, err := b.Head(ctx, src)
	if err != nil {
		return bucket.Info{}, err
	}
	source := (&url.URL{Path: b.bucket + "/" + fullSrc}).EscapedPath()
	out, err := b.client.CopyObject(ctx, &s3.CopyObjectInput{
		Bucket: &b.bucket, Key: &fullDst, CopySource: &source, CopySourceIfMatch: aws.String(info.ETag),
	})
	if err != nil {
		err = mapErr("copying", src+" to "+dst, err)
		if errors.Is(err, bucket.ErrPreconditionFailed) {
			// The source changed between Head and Copy; the caller may simply retry.
			return bucket.Info{}, fmt.Errorf("s3bucket: copying %s: source changed during copy: %w", src, bucket.ErrConflict)
		}
		return bucket.Info{}, err
	}
	res := bucket.Info{Key: dst, Size: info.Size, ETag: info.ETag}
	if r := out.CopyObjectResult; r != nil {
		if r.ETag != nil {
			res.ETag = *r.ETag
		}
		res.LastModified = aws.ToTime(r.LastModified)
	}
	return res, nil
}

// List returns one page (up to 1,000 keys) under prefix, with Now from the response's
// Date header: the store's clock, which liveness compares LastModified against.
func (b *Bucket) List(ctx context.Context, prefix, token string) (bucket.ListPage, error) {
	if err := bucket.CheckPrefix(prefix); err != nil {
		return bucket.ListPage{}, fmt.Errorf("s3bucket: %w", err)
	}
	full := bucket.JoinPrefix(b.prefix, prefix)
	in := &s3.ListObjectsV2Input{Bucket: &b.bucket, MaxKeys: aws.Int32(1000)}
	if full != "" {
		in.Prefix = &full
	}
	if token != "" {
		in.ContinuationToken = &token
	}
	out, err := b.client.ListObjectsV2(ctx, in)
	if err != nil {
		return bucket.ListPage{}, mapErr("listing", prefix, err)
	}
	page := bucket.ListPage{Now: responseDate(out.ResultMetadata)}
	if page.Now.IsZero() {
		page.Now = time.Now() // a store without a Date header; none seen in practice
	}
	for _, o := range out.Contents {
		page.Objects = append(page.Objects, bucket.Info{
			Key: b.rel(aws.ToString(o.Key)), Size: aws.ToInt64(o.Size), ETag: aws.ToString(o.ETag), LastModified: aws.ToTime(o.LastModified),
		})
	}
	if aws.ToBool(out.IsTruncated) {
		page.NextToken = aws.ToString(out.NextContinuationToken)
	}
	return page, nil
}

// Interface guards
var _ bucket.Bucket = (*Bucket)(nil)

// ErrNoCredentials is CheckCredentials' answer when the AWS credential chain found none.
var ErrNoCredentials = errors.New("no AWS credentials: the chain looked at $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY, " +
	"the profile $AWS_PROFILE (default \"default\") in ~/.aws/credentials and ~/.aws/config ($AWS_SHARED_CREDENTIALS_FILE, $AWS_CONFIG_FILE), " +
	"$AWS_WEB_IDENTITY_TOKEN_FILE, $AWS_CONTAINER_CREDENTIALS_RELATIVE_URI and _FULL_URI, and the EC2 instance metadata service")

// CheckCredentials walks the AWS credential chain once, as the first request would: nil
// when it found credentials, ErrNoCredentials (one line naming where it looked) when it
// found none, else the error of the source that failed, on one line. It sends nothing to
// the bucket.
func (b *Bucket) CheckCredentials(ctx context.Context) error {
	p := b.client.Options().Credentials
	if p == nil {
		return ErrNoCredentials
	}
	if _, err := p.Retrieve(ctx); err != nil {
		msg := err.Error()
		if strings.Contains(msg, "no EC2 IMDS role found") || strings.Contains(msg, "failed to refresh cached credentials") {
			return ErrNoCredentials
		}
		return fmt.Errorf("reading AWS credentials: %s", strings.Join(strings.Fields(msg), " "))
	}
	return nil
}
