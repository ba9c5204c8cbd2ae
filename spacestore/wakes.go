package spacestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// NextWakeFile is where an instance leaves its next wanted wake time, relative to its data dir.
const NextWakeFile = ".lchat/next-wake"

// nextWakeMax bounds next-wake: an RFC 3339 time is short.
const nextWakeMax = 256

// ReadNextWake reads $LCHAT_DATA_DIR/.lchat/next-wake: nil when absent or empty. The box
// reads it with privileges the instance lacks, and the instance controls every name under
// its data dir: the file is opened beneath the data dir only (a symlink out of it is
// refused), anything but a small regular file (a FIFO, socket, device, symlink or
// directory) is refused with ErrNotRegular without blocking, and an error never quotes
// what it read.
func ReadNextWake(dataDir string) (*time.Time, error) {
	root, err := os.OpenRoot(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer root.Close()
	name := filepath.FromSlash(NextWakeFile)
	info, err := root.Lstat(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %v", NextWakeFile, err)
	}
	if err := checkSmallRegular(NextWakeFile, info, nextWakeMax); err != nil {
		return nil, err
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENXIO) {
			return nil, fmt.Errorf("%s: changed while opening: %w", NextWakeFile, ErrNotRegular)
		}
		return nil, fmt.Errorf("opening %s: %v", NextWakeFile, err)
	}
	defer f.Close()
	if info, err = f.Stat(); err == nil {
		err = checkSmallRegular(NextWakeFile, info, nextWakeMax)
	}
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, nextWakeMax))
	if err != nil {
		return nil, err
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: not an RFC 3339 time", NextWakeFile)
	}
	return &t, nil
}

// PutWake records host's next scheduled wake under wakes/<host>.
func PutWake(ctx context.Context, b bucket.Bucket, host string, at time.Time) (string, error) {
	body := at.UTC().Format(time.RFC3339Nano)
	info, err := b.Put(ctx, WakeKey(host), strings.NewReader(body), int64(len(body)), bucket.Cond{})
	if err != nil {
		return "", fmt.Errorf("recording scheduled wake: %w", err)
	}
	return info.ETag, nil
}

// DeleteWake removes a wake record; with etag set only if it is still that record, so a newer
// record written meanwhile survives. A record already gone is not an error.
func DeleteWake(ctx context.Context, b bucket.Bucket, host, etag string) error {
	err := b.Delete(ctx, WakeKey(host), bucket.Cond{IfMatch: etag})
	if err == nil || errors.Is(err, bucket.ErrNotFound) {
		return nil
	}
	if bucket.LostRace(err) && etag != "" {
		if _, herr := b.Head(ctx, WakeKey(host)); errors.Is(herr, bucket.ErrNotFound) {
			return nil
		}
		return err
	}
	return fmt.Errorf("deleting scheduled wake: %w", err)
}

// WakeRecord is one scheduled wake.
type WakeRecord struct {
	Host string
	At   time.Time
	ETag string
}

// WakeScanner lists wakes/ once per scan and reads only the records whose ETag it has not
// seen before. Not safe for concurrent use.
type WakeScanner struct {
	Bucket bucket.Bucket

	seen map[string]WakeRecord // by host; body is immutable per ETag
}

// Scan returns every scheduled wake and the bucket's clock at the time of the listing. A
// record that cannot be read or parsed is left out and reported in the error, while the
// others are still returned with the clock: one bad object must not hold back every
// other space's wake. A failed listing returns no records.
func (w *WakeScanner) Scan(ctx context.Context) ([]WakeRecord, time.Time, error) {
	if w.seen == nil {
		w.seen = make(map[string]WakeRecord)
	}
	var (
		out     []WakeRecord
		now     time.Time
		token   string
		found   = make(map[string]bool)
		badRecs []error
	)
	for {
		page, err := w.Bucket.List(ctx, WakesPrefix, token)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("listing scheduled wakes: %w", err)
		}
		if now.IsZero() {
			now = page.Now
		}
		for _, obj := range page.Objects {
			host := strings.TrimPrefix(obj.Key, WakesPrefix)
			if host == "" || strings.Contains(host, "/") {
				continue
			}
			found[host] = true
			if rec, ok := w.seen[host]; ok && rec.ETag == obj.ETag {
				out = append(out, rec)
				continue
			}
			rec, err := readWake(ctx, w.Bucket, host)
			if errors.Is(err, bucket.ErrNotFound) {
				continue
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil, time.Time{}, err
				}
				badRecs = append(badRecs, err)
				continue
			}
			w.seen[host] = rec
			out = append(out, rec)
		}
		token = page.NextToken
		if token == "" {
			break
		}
	}
	for h := range w.seen {
		if !found[h] {
			delete(w.seen, h)
		}
	}
	if now.IsZero() {
		now = time.Now()
	}
	return out, now, errors.Join(badRecs...)
}

func readWake(ctx context.Context, b bucket.Bucket, host string) (WakeRecord, error) {
	obj, err := b.Get(ctx, WakeKey(host))
	if err != nil {
		return WakeRecord{}, err
	}
	defer obj.Body.Close()
	data, err := io.ReadAll(io.LimitReader(obj.Body, 1024))
	if err != nil {
		return WakeRecord{}, fmt.Errorf("reading scheduled wake of %s: %w", host, err)
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(data)))
	if err != nil {
		return WakeRecord{}, fmt.Errorf("parsing scheduled wake of %s: %v", host, err)
	}
	return WakeRecord{Host: host, At: t, ETag: obj.ETag}, nil
}
