package mesh

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/lchat/lchat-caddy/registry"
)

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
	return hb, nil
}
