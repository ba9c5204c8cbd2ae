// Package certstorage is caddy.storage.lchat: Caddy's certificate storage (a
// certmagic.Storage) on the lchat bucket, so every box of a fleet shares one set of
// certificates and ACME accounts. certmagic's locks are a certlock.Locker on the same
// bucket, so boxes never run two ACME orders for one name at once. This package is the
// Caddy glue: config, Caddyfile, and the mapping of certmagic's keys onto the bucket.
package certstorage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"github.com/google/uuid"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/certlock"
)

func init() {
	caddy.RegisterModule(Module{})
}

// DefaultPrefix is the sub-prefix of the bucket that holds certificates.
const DefaultPrefix = "certs"

// Module is the caddy.storage.lchat storage module.
type Module struct {
	// BucketRaw is the lchat.buckets.* module the certificates live in. Required.
	BucketRaw json.RawMessage `json:"bucket,omitempty" caddy:"namespace=lchat.buckets inline_key=backend"`

	// Prefix is the sub-prefix, within the bucket's own prefix, for certificate
	// keys. Default: "certs".
	Prefix string `json:"prefix,omitempty"`

	// LockTTL is how long a lock stays valid without a refresh, i.e. how long a
	// killed holder blocks others. Default: 2m.
	LockTTL caddy.Duration `json:"lock_ttl,omitempty"`

	// LockRefresh is how often a held lock is refreshed. Default: lock_ttl/4.
	LockRefresh caddy.Duration `json:"lock_refresh,omitempty"`

	// LockPoll is how often a box waiting for a lock looks again. Default: 1s.
	LockPoll caddy.Duration `json:"lock_poll,omitempty"`

	storage *Storage
}

// CaddyModule returns the Caddy module information.
func (Module) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.storage.lchat",
		New: func() caddy.Module { return new(Module) },
	}
}

// Provision loads the bucket and applies defaults.
func (m *Module) Provision(ctx caddy.Context) error {
	if m.BucketRaw == nil {
		return errors.New("caddy.storage.lchat: bucket is required")
	}
	val, err := ctx.LoadModule(m, "BucketRaw")
	if err != nil {
		return fmt.Errorf("loading bucket: %v", err)
	}
	b, ok := val.(bucket.Bucket)
	if !ok {
		return fmt.Errorf("caddy.storage.lchat: module %T is not a bucket", val)
	}
	m.Prefix = caddy.NewReplacer().ReplaceAll(m.Prefix, "")
	if m.Prefix == "" {
		m.Prefix = DefaultPrefix
	}
	prefix, err := bucket.CleanPrefix(m.Prefix)
	if err != nil {
		return fmt.Errorf("caddy.storage.lchat: %v", err)
	}
	if m.LockTTL == 0 {
		m.LockTTL = caddy.Duration(certlock.DefaultTTL)
	}
	if m.LockRefresh == 0 {
		m.LockRefresh = m.LockTTL / 4
	}
	if m.LockPoll == 0 {
		m.LockPoll = caddy.Duration(certlock.DefaultPoll)
	}
	host, _ := os.Hostname()
	locker := &certlock.Locker{
		Owner:   fmt.Sprintf("%s/%d/%s", host, os.Getpid(), uuid.NewString()[:8]),
		TTL:     time.Duration(m.LockTTL),
		Refresh: time.Duration(m.LockRefresh),
		Poll:    time.Duration(m.LockPoll),
		Logger:  ctx.Logger().Named("locks"),
	}
	m.storage = NewStorage(b, prefix, locker)
	return nil
}

// Validate checks that the lock timings can work.
func (m *Module) Validate() error {
	if m.LockTTL < 0 || m.LockRefresh < 0 || m.LockPoll < 0 {
		return errors.New("caddy.storage.lchat: lock durations must not be negative")
	}
	if m.LockRefresh >= m.LockTTL {
		return fmt.Errorf("caddy.storage.lchat: lock_refresh (%v) must be shorter than lock_ttl (%v)",
			time.Duration(m.LockRefresh), time.Duration(m.LockTTL))
	}
	return nil
}

// CertMagicStorage returns the storage certmagic uses.
func (m *Module) CertMagicStorage() (certmagic.Storage, error) {
	return m.storage, nil
}

// Cleanup stops refreshing locks this config still holds and takes no new ones.
// certmagic still releases them when its cancelled work returns (and at process
// exit), which deletes them at once; one never released expires after lock_ttl.
func (m *Module) Cleanup() error {
	if m.storage != nil {
		m.storage.Locker.Close()
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner      = (*Module)(nil)
	_ caddy.Validator        = (*Module)(nil)
	_ caddy.CleanerUpper     = (*Module)(nil)
	_ caddy.StorageConverter = (*Module)(nil)
)
