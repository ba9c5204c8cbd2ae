package provider

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/spacestore"
)

// The export: how a space's state travels between a fleet and its provider, which keep
// it in different buckets and hold no credentials of each other's. It is what
// spacestore.CopySpace copies (the objects the manifest and its history reference, the
// history entries, the manifest; never the lease), as a stream:
//
//	lchat-space-export/1 <host>\n
//	obj <size> <sha256 hex> <key under spaces/<host>/>\n<size bytes>   (repeated)
//	end <objects> <bytes> <hex HMAC-SHA256(token, every byte before this line)>\n
//
// signed with the sender's token for that direction (a fleet's Provider.Token, a
// provider's Client.SignToken). A reader checks each object's hash and the end's count,
// size and signature before anything reaches its bucket: it spools the stream to a
// directory of its own first (SpoolExport), then copies by spacestore.CopySpace, whose
// rules hold (the manifest last, compare-and-swap; a destination with the same or a
// newer generation is left alone).

// exportMagic opens every export.
const exportMagic = "lchat-space-export/1"

// Limits bound an export a reader takes. Zero fields take the defaults.
type Limits struct {
	// MaxBytes bounds the objects' total size. Default 8 GiB.
	MaxBytes int64
	// MaxObjects bounds their number. Default 1,000,000.
	MaxObjects int
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = 8 << 30
	}
	if l.MaxObjects <= 0 {
		l.MaxObjects = 1_000_000
	}
	return l
}

// ErrBadExport is an export that is malformed, truncated, over its limits or signed
// with another key: nothing of it was kept.
var ErrBadExport = errors.New("bad export")

func badExport(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadExport, fmt.Sprintf(format, args...))
}

// never is the liveness of a spool directory's leases: it has none.
func never(string, string) bool { return false }

// tempSpool is a file bucket in a fresh directory under tmp, removed by done.
func tempSpool(tmp, prefix string) (spool bucket.Bucket, done func(), err error) {
	dir, err := os.MkdirTemp(tmp, prefix)
	if err != nil {
		return nil, nil, fmt.Errorf("making the spool: %v", err)
	}
	fb, err := filebucket.New(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return fb, func() { os.RemoveAll(dir) }, nil
}

// WriteExport writes the export of host's space in src (asleep: its lease free by
// srcLive) to w, signed with key. tmp is a directory for the spool, removed after.
func WriteExport(ctx context.Context, w io.Writer, src bucket.Bucket, srcLive spacestore.LiveFunc, host, tmp string, key mesh.Secret) (spacestore.CopyResult, error) {
	spool, done, err := tempSpool(tmp, "export-")
	if err != nil {
		return spacestore.CopyResult{}, err
	}
	defer done()
	res, err := spacestore.CopySpace(ctx, src, spool, host, srcLive, never)
	if err != nil {
		return res, err
	}
	return res, writeStream(ctx, w, spool, host, key)
}

// writeStream writes every object of spool under spaces/<host>/ as an export.
func writeStream(ctx context.Context, w io.Writer, spool bucket.Bucket, host string, key mesh.Secret) error {
	mac := hmac.New(sha256.New, []byte(key))
	out := io.MultiWriter(w, mac)
	if _, err := fmt.Fprintf(out, "%s %s\n", exportMagic, host); err != nil {
		return err
	}
	prefix := spacePrefix(host)
	var n int
	var total int64
	for token := ""; ; {
		page, err := spool.List(ctx, prefix, token)
		if err != nil {
			return fmt.Errorf("listing the spool: %v", err)
		}
		for _, o := range page.Objects {
			if err := writeObject(ctx, out, spool, o, prefix); err != nil {
				return err
			}
			n++
			total += o.Size
		}
		if token = page.NextToken; token == "" {
			break
		}
	}
	_, err := fmt.Fprintf(w, "end %d %d %s\n", n, total, hex.EncodeToString(mac.Sum(nil)))
	return err
}

func writeObject(ctx context.Context, out io.Writer, spool bucket.Bucket, o bucket.Info, prefix string) error {
	obj, err := spool.Get(ctx, o.Key)
	if err != nil {
		return fmt.Errorf("reading the spool: %v", err)
	}
	defer obj.Body.Close()
	h := sha256.New()
	// Hash first (the header carries it), then send: the spool is local.
	if _, err := io.Copy(h, obj.Body); err != nil {
		return fmt.Errorf("reading the spool: %v", err)
	}
	obj.Body.Close()
	if obj, err = spool.Get(ctx, o.Key); err != nil {
		return fmt.Errorf("reading the spool: %v", err)
	}
	defer obj.Body.Close()
	rel := strings.TrimPrefix(o.Key, prefix)
	if _, err := fmt.Fprintf(out, "obj %d %s %s\n", obj.Size, hex.EncodeToString(h.Sum(nil)), rel); err != nil {
		return err
	}
	if n, err := io.Copy(out, obj.Body); err != nil || n != obj.Size {
		return fmt.Errorf("sending %s: %d of %d bytes: %v", rel, n, obj.Size, err)
	}
	return nil
}

// ReadExport reads an export of host from r into dst (its lease, if any, free by
// dstLive), checking it against key and lim first: a bad export (ErrBadExport) leaves
// dst as it was. tmp is a directory for the spool, removed after. The copy into dst is
// spacestore.CopySpace's: a dst with the same or a newer generation is left alone
// (CopyResult.Skipped). The space's scheduled wake is not recorded: the side that
// serves the space next does that (restoreWake) once it serves it.
func ReadExport(ctx context.Context, r io.Reader, dst bucket.Bucket, dstLive spacestore.LiveFunc, host, tmp string, key mesh.Secret, lim Limits) (spacestore.CopyResult, error) {
	spool, done, err := tempSpool(tmp, "import-")
	if err != nil {
		return spacestore.CopyResult{}, err
	}
	defer done()
	if err := readStream(ctx, r, spool, host, key, lim.withDefaults()); err != nil {
		return spacestore.CopyResult{}, err
	}
	return spacestore.CopySpace(ctx, spool, dst, host, never, dstLive)
}

// restoreWake records host's next scheduled wake in b from its manifest, which carries
// it. The record (wakes/<host>) is outside the space's prefix, the one thing of it a copy
// leaves behind, and a bucket's scan drops a due record of a space its fleet does not run
// (moving, delegated, held): so the side a move leaves the space with records it again
// once it serves the space, and a wake due meanwhile fires then.
func restoreWake(ctx context.Context, b bucket.Bucket, host string) error {
	m, _, err := spacestore.ReadManifest(ctx, b, host)
	if err != nil {
		return fmt.Errorf("reading the manifest: %v", err)
	}
	if m == nil || m.NextWake == nil {
		return nil
	}
	_, err = spacestore.PutWake(ctx, b, host, *m.NextWake)
	return err
}

// readStream spools an export into spool, checking everything before it returns nil.
func readStream(ctx context.Context, r io.Reader, spool bucket.Bucket, host string, key mesh.Secret, lim Limits) error {
	mac := hmac.New(sha256.New, []byte(key))
	br := bufio.NewReaderSize(r, 64<<10)
	line := func(signed bool) (string, error) {
		s, err := readLine(br, 1024)
		if err != nil {
			return "", err
		}
		if signed {
			mac.Write([]byte(s + "\n"))
		}
		return s, nil
	}
	head, err := line(true)
	if err != nil {
		return err
	}
	if head != exportMagic+" "+host {
		return badExport("not an export of %s", host)
	}
	prefix := spacePrefix(host)
	var n int
	var total int64
	for {
		// The end line is not under its own MAC: peek at its word first.
		peek, _ := br.Peek(4)
		if string(peek) == "end " {
			s, err := line(false)
			if err != nil {
				return err
			}
			return checkEnd(s, n, total, mac)
		}
		s, err := line(true)
		if err != nil {
			return err
		}
		size, sum, rel, err := parseObj(s)
		if err != nil {
			return err
		}
		if n++; n > lim.MaxObjects {
			return badExport("more than %d objects", lim.MaxObjects)
		}
		if total += size; total > lim.MaxBytes {
			return badExport("more than %d bytes", lim.MaxBytes)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		h := sha256.New()
		body := io.TeeReader(io.LimitReader(br, size), io.MultiWriter(h, mac))
		if _, err := spool.Put(ctx, prefix+rel, &exactReader{r: body, left: size}, size, bucket.Cond{}); err != nil {
			if errors.Is(err, ErrBadExport) {
				return err
			}
			return fmt.Errorf("spooling %s: %v", rel, err)
		}
		if hex.EncodeToString(h.Sum(nil)) != sum {
			return badExport("%s does not match its hash", rel)
		}
	}
}

// exactReader fails a body that ends before its announced size.
type exactReader struct {
	r    io.Reader
	left int64
}

func (e *exactReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		return n, badExport("truncated")
	}
	return n, err
}

func readLine(br *bufio.Reader, max int) (string, error) {
	var b []byte
	for {
		frag, err := br.ReadSlice('\n')
		b = append(b, frag...)
		if len(b) > max {
			return "", badExport("a line longer than %d bytes", max)
		}
		if err == nil {
			return string(b[:len(b)-1]), nil
		}
		if err != bufio.ErrBufferFull {
			return "", badExport("truncated")
		}
	}
}

func parseObj(s string) (size int64, sum, rel string, err error) {
	f := strings.Split(s, " ")
	if len(f) != 4 || f[0] != "obj" {
		return 0, "", "", badExport("malformed object line")
	}
	size, perr := strconv.ParseInt(f[1], 10, 64)
	if perr != nil || size < 0 || strconv.FormatInt(size, 10) != f[1] {
		return 0, "", "", badExport("malformed object size")
	}
	if b, herr := hex.DecodeString(f[2]); herr != nil || len(b) != sha256.Size || strings.ToLower(f[2]) != f[2] {
		return 0, "", "", badExport("malformed object hash")
	}
	if !validRel(f[3]) {
		return 0, "", "", badExport("object key %q is not a key of a space's state", f[3])
	}
	return size, f[2], f[3], nil
}

// validRel accepts the key of an object of a space's state, relative to its prefix:
// segments of letters, digits, '.', '_' and '-', none empty, "." or "..", and never the
// lease (a space's lease is its holder's, in its own bucket).
func validRel(rel string) bool {
	if rel == "" || len(rel) > 512 || rel == "lease" {
		return false
	}
	for _, seg := range strings.Split(rel, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return false
			}
		}
	}
	return true
}

func checkEnd(s string, n int, total int64, mac hash.Hash) error {
	f := strings.Split(s, " ")
	if len(f) != 4 || f[1] != strconv.Itoa(n) || f[2] != strconv.FormatInt(total, 10) {
		return badExport("the end does not match the objects sent")
	}
	got, err := hex.DecodeString(f[3])
	if err != nil || !hmac.Equal(got, mac.Sum(nil)) {
		return badExport("signature mismatch")
	}
	return nil
}

// spacePrefix is where a space's state lives in a bucket (bucket layout in
// docs/architecture.md).
func spacePrefix(host string) string { return "spaces/" + host + "/" }
