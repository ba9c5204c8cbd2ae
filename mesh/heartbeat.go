package mesh

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/lchat/lchat-caddy/registry"
)

// MembersPrefix is where heartbeats live, relative to the bucket's prefix.
const MembersPrefix = "mesh/members/"

// HeartbeatKey is the bucket key of a member's heartbeat: MembersPrefix followed by the
// unpadded base64url encoding of its SELF, so one LIST yields every member's identity.
func HeartbeatKey(self string) string {
	return MembersPrefix + base64.RawURLEncoding.EncodeToString([]byte(self))
}

// SelfFromKey decodes a heartbeat key (with or without MembersPrefix) back to its SELF.
func SelfFromKey(key string) (string, bool) {
	// One SELF has exactly one key: Strict refuses other padding bits, and the encoding
	// must be the canonical one, since the decoder skips CR and LF even when strict.
	enc := strings.TrimPrefix(key, MembersPrefix)
	b, err := base64.RawURLEncoding.Strict().DecodeString(enc)
	if err != nil || len(b) == 0 || base64.RawURLEncoding.EncodeToString(b) != enc {
		return "", false
	}
	self, err := ParseSelf(string(b))
	if err != nil || self != string(b) {
		return "", false
	}
	return self, true
}

// Heartbeat is the body of a heartbeat object. It is written byte-for-byte identically on
// every beat of one process, which is what keeps peers from re-reading it (see Membership),
// until it changes: when the box starts draining, and when its published load moves by a
// step (PublishLoad).
type Heartbeat struct {
	Region      string   `json:"region"`
	Domains     []string `json:"domains"`
	Incarnation string   `json:"incarnation"`
	Version     string   `json:"version"`
	// Address is the box's public address (an IP), the target of a relocated space's
	// DNS record. Optional.
	Address string `json:"address,omitempty"`
	// Bucket names the bucket the box keeps its spaces in (its String(), never
	// credentials), so a relocation can tell a shared bucket from a per-region one.
	Bucket string `json:"bucket,omitempty"`
	// Draining is set while the box shuts down: peers take it out of placement and
	// fan-out at once, but it is still live, so the leases it holds stay held until it
	// releases them (see MarkDraining).
	Draining bool `json:"draining,omitempty"`
	// Load is the box's memory: warm set, budget, awake spaces (absent from older boxes).
	Load
}

// ApplyTo copies what the heartbeat says about its box into mem.
func (hb Heartbeat) ApplyTo(mem *Member) {
	mem.Region, mem.Domains, mem.Incarnation, mem.Version = hb.Region, hb.Domains, hb.Incarnation, hb.Version
	mem.Address, mem.Bucket, mem.Draining = hb.Address, hb.Bucket, hb.Draining
	mem.Load = hb.Load
}

// encodeHeartbeat is the body a box writes for hb. The same hb always encodes to the same
// bytes, which is what keeps a beat's ETag stable (see Membership).
func encodeHeartbeat(hb Heartbeat) ([]byte, error) {
	hb.Domains = append([]string{}, hb.Domains...) // "domains": [] rather than null
	return json.Marshal(hb)
}

// DecodeHeartbeat decodes a heartbeat object and checks what peers act on: its region
// (placement), domains (fan-out scope), incarnation (the lease rule) and address (DNS
// target of a relocation). A heartbeat that fails is ignored like one that does not
// decode: one bad object never becomes a member with a scope nobody configured.
func DecodeHeartbeat(raw []byte) (Heartbeat, error) {
	var hb Heartbeat
	if err := json.Unmarshal(raw, &hb); err != nil {
		return Heartbeat{}, fmt.Errorf("decoding heartbeat: %v", err)
	}
	if hb.Region != "" {
		if err := registry.ValidateRegion(hb.Region); err != nil {
			return Heartbeat{}, fmt.Errorf("heartbeat: %v", err)
		}
	}
	for _, d := range hb.Domains {
		if !validHostname(d) {
			return Heartbeat{}, fmt.Errorf("heartbeat: domain %q is not a DNS name", d)
		}
	}
	if hb.Incarnation == "" || !validToken(hb.Incarnation) {
		return Heartbeat{}, fmt.Errorf("heartbeat: incarnation must be 1-%d letters, digits, '.', '_' or '-'", maxShortField)
	}
	if hb.Address != "" {
		if _, err := netip.ParseAddr(hb.Address); err != nil {
			return Heartbeat{}, fmt.Errorf("heartbeat: address %q is not an IP address", hb.Address)
		}
	}
	if hb.WarmSet < 0 || hb.Budget < 0 || hb.Awake < 0 {
		return Heartbeat{}, errors.New("heartbeat: negative warm_set, budget or awake")
	}
	return hb, nil
}
