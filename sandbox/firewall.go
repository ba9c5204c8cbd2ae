package sandbox

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// deniedPrefixes are the destinations an instance under network egress may not reach
// (besides every address of the box itself and the mesh peers): loopback, "this host",
// link-local (169.254.169.254, the cloud metadata service, lives there), carrier-grade
// NAT (100.100.100.200 is Alibaba's metadata service), the private ranges (RFC 1918,
// fc00::/7 with AWS's fd00:ec2::254), multicast and the reserved 240/4 with the limited
// broadcast, and the same IPv4 ranges behind the NAT64 prefixes.
var deniedPrefixes = func() []netip.Prefix {
	v4 := []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
	}
	v6 := []string{"::/127", "64:ff9b:1::/48", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8"}
	var out []netip.Prefix
	for _, s := range v4 {
		out = append(out, netip.MustParsePrefix(s))
	}
	for _, s := range v6 {
		out = append(out, netip.MustParsePrefix(s))
	}
	// A NAT64 gateway (64:ff9b::/96, RFC 6052) translates to the IPv4 address in the low
	// 32 bits: 64:ff9b::a9fe:a9fe is the metadata service on a box with DNS64/NAT64.
	for _, s := range v4 {
		p := netip.MustParsePrefix(s)
		a := [16]byte{0x00, 0x64, 0xff, 0x9b}
		b := p.Addr().As4()
		copy(a[12:], b[:])
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(a), 96+p.Bits()))
	}
	return out
}()

// Egress is how the traffic of one instance's uid is filtered.
type Egress struct {
	// Host lets the uid through unfiltered: network host on an isolated kind.
	Host bool
	// Allow re-opens these prefixes: they are accepted before any refusal.
	Allow []netip.Prefix
}

// FirewallConfig configures OpenFirewall.
type FirewallConfig struct {
	// UIDFirst and UIDCount are the spaces' uid range: every uid in it is filtered
	// unless Admit said otherwise for it.
	UIDFirst, UIDCount uint32
	// Resolvers receive DNS (UDP and TCP port 53) from the spaces. Default: the
	// nameservers of /etc/resolv.conf (ReadResolvers).
	Resolvers []netip.Addr
	// NetNS, when not 0, is a descriptor of the network namespace to install the table
	// in; 0 is this process's. Tests install it into a namespace of their own.
	NetNS int
}

// Firewall is the egress filter of one box: an nftables table (family inet) of its own,
// installed once, whose output hook matches the owner uid of each locally sent packet.
//
//	output (hook output, priority filter, policy accept):
//	    meta skuid vmap @spaces                      per-uid exceptions (Admit)
//	    meta skuid <UIDFirst>-<last> goto egress     every other space uid
//	egress:
//	    DNS to the resolvers                         accept
//	    fib daddr type local|broadcast|anycast|multicast, deniedPrefixes, @peers4, @peers6
//	                                                 goto deny
//	allow_<hash>:  Allow prefixes accept, then goto egress
//	deny:          tcp: reject with tcp reset (connect fails at once: ECONNREFUSED);
//	               else reject with icmpx admin-prohibited (send fails: EPERM)
//
// The table costs nothing per start for an egress instance in the range; Admit adds one
// map element for the others. The rules see only packets of sockets whose owner is a
// space's uid: the box's own traffic is never filtered, and a Unix socket is no packet.
type Firewall struct {
	name string
	cfg  FirewallConfig

	mu     sync.Mutex
	conn   *nftables.Conn // guarded by mu; nil once closed
	table  *nftables.Table
	spaces *nftables.Set
	peers  [2]*nftables.Set // IPv4, IPv6
	// allow are the allow chains made so far, by name; guarded by mu.
	allow map[string]bool
	// admitted is each uid's current exception and the generation that set it, so a
	// release of an old admission does not undo a newer one; guarded by mu.
	admitted map[uint32]admission
	gen      uint64 // guarded by mu
}

type admission struct {
	verdict string // "accept" or the chain it goes to
	gen     uint64
}

// tableSeq numbers the tables of one process: several engines (tests) have one each.
var tableSeq atomic.Uint64

// installMu serializes the installs of this process's tables.
var installMu sync.Mutex

// tablePrefix starts the name of every table a box installs: lchat_<pid>_<n>.
const tablePrefix = "lchat_"

// OpenFirewall removes the tables of boxes that died without removing theirs, and
// installs this one's. It fails without CAP_NET_ADMIN, or on a kernel without nf_tables
// and its meta, fib and reject expressions.
func OpenFirewall(cfg FirewallConfig) (*Firewall, error) {
	if cfg.UIDCount == 0 || uint64(cfg.UIDFirst)+uint64(cfg.UIDCount) > 1<<32-1 {
		return nil, fmt.Errorf("uid range %d+%d: must be non-empty and below 2^32-1", cfg.UIDFirst, cfg.UIDCount)
	}
	if cfg.NetNS == 0 {
		if err := CheckFirewallCaps(); err != nil {
			return nil, err
		}
	}
	if cfg.Resolvers == nil {
		r, err := ReadResolvers("/etc/resolv.conf")
		if err != nil {
			return nil, err
		}
		cfg.Resolvers = r
	}
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if cfg.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(cfg.NetNS))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening netlink to nftables: %v", err)
	}
	f := &Firewall{
		name:     tablePrefix + strconv.Itoa(os.Getpid()) + "_" + strconv.FormatUint(tableSeq.Add(1), 10),
		cfg:      cfg,
		conn:     conn,
		allow:    map[string]bool{},
		admitted: map[uint32]admission{},
	}
	f.sweep()
	// The library numbers sets from one global counter, unguarded across connections.
	installMu.Lock()
	err = f.install()
	installMu.Unlock()
	if err != nil {
		conn.CloseLasting()
		return nil, fmt.Errorf("installing the egress filter (the kernel needs nf_tables with its meta, fib and reject expressions): %v", err)
	}
	return f, nil
}

// CheckFirewallCaps returns an error naming CAP_NET_ADMIN when this box lacks it: the
// egress filter cannot be installed without it.
func CheckFirewallCaps() error {
	return requireCap(CapNetAdmin, "network egress needs CAP_NET_ADMIN, which this box lacks (grant it with AmbientCapabilities= in the systemd unit, run as root, or set network host)")
}

// sweep deletes the tables of box processes that are gone (kill -9): a stale table
// filters uids its box no longer runs and holds exceptions nobody will release.
func (f *Firewall) sweep() {
	tables, err := f.conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return
	}
	stale := 0
	for _, t := range tables {
		pid, _, ok := strings.Cut(strings.TrimPrefix(t.Name, tablePrefix), "_")
		n, err := strconv.Atoi(pid)
		if !strings.HasPrefix(t.Name, tablePrefix) || !ok || err != nil || n == os.Getpid() || processAlive(n) {
			continue
		}
		f.conn.DelTable(t)
		stale++
	}
	if stale > 0 {
		f.conn.Flush()
	}
}

// Name is the table's name, for logs (nft list table inet <name>).
func (f *Firewall) Name() string { return f.name }

// Describe says what the table filters, for the start-up log.
func (f *Firewall) Describe() string {
	rs := make([]string, len(f.cfg.Resolvers))
	for i, r := range f.cfg.Resolvers {
		rs[i] = r.String()
	}
	return fmt.Sprintf("nftables table inet %s: uids %d-%d, DNS to %s", f.name, f.cfg.UIDFirst,
		f.cfg.UIDFirst+f.cfg.UIDCount-1, strings.Join(rs, ", "))
}

const (
	chainOutput = "output"
	chainEgress = "egress"
	chainDeny   = "deny"
)

func (f *Firewall) install() error {
	c := f.conn
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: f.name})
	f.table = t
	deny := c.AddChain(&nftables.Chain{Name: chainDeny, Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: deny, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: deny, Exprs: []expr.Any{
		&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED},
	}})

	f.peers[0] = &nftables.Set{Table: t, Name: "peers4", KeyType: nftables.TypeIPAddr}
	f.peers[1] = &nftables.Set{Table: t, Name: "peers6", KeyType: nftables.TypeIP6Addr}
	for _, s := range f.peers {
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
	}
	egress := c.AddChain(&nftables.Chain{Name: chainEgress, Table: t})
	for _, r := range f.cfg.Resolvers {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			ex := append(daddrIs(netip.PrefixFrom(r, r.BitLen())),
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(53)},
				&expr.Verdict{Kind: expr.VerdictAccept})
			c.AddRule(&nftables.Rule{Table: t, Chain: egress, Exprs: ex})
		}
	}
	for _, typ := range []uint32{unix.RTN_LOCAL, unix.RTN_BROADCAST, unix.RTN_ANYCAST, unix.RTN_MULTICAST} {
		c.AddRule(&nftables.Rule{Table: t, Chain: egress, Exprs: []expr.Any{
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(typ)},
			goTo(chainDeny),
		}})
	}
	for _, p := range deniedPrefixes {
		c.AddRule(&nftables.Rule{Table: t, Chain: egress, Exprs: append(daddrIs(p), goTo(chainDeny))})
	}
	for i, s := range f.peers {
		c.AddRule(&nftables.Rule{Table: t, Chain: egress, Exprs: append(daddrLoad(i == 1),
			&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
			goTo(chainDeny))})
	}

	f.spaces = &nftables.Set{Table: t, Name: "spaces", KeyType: nftables.TypeUID, DataType: nftables.TypeVerdict, IsMap: true}
	if err := c.AddSet(f.spaces, nil); err != nil {
		return err
	}
	accept := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{Name: chainOutput, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: f.spaces.Name, SetID: f.spaces.ID, DestRegister: 0, IsDestRegSet: true},
	}})
	last := f.cfg.UIDFirst + f.cfg.UIDCount - 1
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: binaryutil.BigEndian.PutUint32(f.cfg.UIDFirst),
			ToData: binaryutil.BigEndian.PutUint32(last)},
		goTo(chainEgress),
	}})
	return c.Flush()
}

func goTo(chain string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain} }

// daddrLoad loads the destination address of an IPv4 (or IPv6) packet into register 1.
func daddrLoad(v6 bool) []expr.Any {
	proto, off, n := byte(unix.NFPROTO_IPV4), uint32(16), uint32(4)
	if v6 {
		proto, off, n = unix.NFPROTO_IPV6, 24, 16
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
	}
}

// daddrIs matches packets whose destination lies in p.
func daddrIs(p netip.Prefix) []expr.Any {
	p = p.Masked()
	ex := daddrLoad(p.Addr().Is6())
	net := p.Addr().AsSlice()
	if p.Bits() < p.Addr().BitLen() {
		mask := make([]byte, len(net))
		for i := range p.Bits() {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		ex = append(ex, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(net)), Mask: mask, Xor: make([]byte, len(net))})
	}
	return append(ex, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net})
}

// Admit sets how uid's traffic is filtered while one instance runs under it, before
// that instance starts, and returns the release to call once it has ended. An egress
// instance whose uid is in the range needs nothing; any other gets an element in the
// spaces map. After a release the uid is filtered as plain egress again, whatever it was
// admitted as, so an ended instance leaves no exception behind.
func (f *Firewall) Admit(uid uint32, eg Egress) (release func(), err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn == nil {
		return nil, errors.New("the egress filter is closed")
	}
	verdict := chainEgress
	switch {
	case eg.Host:
		verdict = "accept"
	case len(eg.Allow) > 0:
		if verdict, err = f.allowChainLocked(eg.Allow); err != nil {
			return nil, err
		}
	}
	f.gen++
	gen := f.gen
	if err := f.setLocked(uid, verdict, gen); err != nil {
		return nil, fmt.Errorf("admitting uid %d to the egress filter: %v", uid, err)
	}
	return sync.OnceFunc(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.conn == nil || f.admitted[uid].gen != gen {
			return
		}
		f.gen++
		f.setLocked(uid, chainEgress, f.gen)
	}), nil
}

func (f *Firewall) inRange(uid uint32) bool {
	return uid >= f.cfg.UIDFirst && uint64(uid) < uint64(f.cfg.UIDFirst)+uint64(f.cfg.UIDCount)
}

// setLocked makes verdict uid's entry in the spaces map: none at all for plain egress
// in the range (the range rule holds it).
func (f *Firewall) setLocked(uid uint32, verdict string, gen uint64) error {
	prev, had := f.admitted[uid]
	want := !(verdict == chainEgress && f.inRange(uid))
	if had && want && prev.verdict == verdict {
		f.admitted[uid] = admission{verdict: verdict, gen: gen}
		return nil
	}
	key := binaryutil.NativeEndian.PutUint32(uid)
	if had {
		f.conn.SetDeleteElements(f.spaces, []nftables.SetElement{{Key: key}})
	}
	if want {
		v := &expr.Verdict{Kind: expr.VerdictAccept}
		if verdict != "accept" {
			v = goTo(verdict)
		}
		f.conn.SetAddElements(f.spaces, []nftables.SetElement{{Key: key, VerdictData: v}})
	}
	if !had && !want {
		return nil
	}
	if err := f.conn.Flush(); err != nil {
		return err
	}
	if want {
		f.admitted[uid] = admission{verdict: verdict, gen: gen}
	} else {
		delete(f.admitted, uid)
	}
	return nil
}

// allowChainLocked returns the chain that accepts allow and then goes on to egress,
// making it on first use. Chains are named by their prefixes, so an instance keeps the
// list it started with across a reload that changes its kind's.
func (f *Firewall) allowChainLocked(allow []netip.Prefix) (string, error) {
	ps := make([]string, len(allow))
	for i, p := range allow {
		ps[i] = p.Masked().String()
	}
	slices.Sort(ps)
	ps = slices.Compact(ps)
	sum := sha256.Sum256([]byte(strings.Join(ps, ",")))
	name := "allow_" + hex.EncodeToString(sum[:6])
	if f.allow[name] {
		return name, nil
	}
	ch := f.conn.AddChain(&nftables.Chain{Name: name, Table: f.table})
	for _, s := range ps {
		ex := append(daddrIs(netip.MustParsePrefix(s)), &expr.Verdict{Kind: expr.VerdictAccept})
		f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: ex})
	}
	f.conn.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: []expr.Any{goTo(chainEgress)}})
	if err := f.conn.Flush(); err != nil {
		return "", fmt.Errorf("adding the allow chain for %s: %v", strings.Join(ps, " "), err)
	}
	f.allow[name] = true
	return name, nil
}

// SetPeers replaces the mesh peers' addresses, refused like the private ranges, in one
// transaction.
func (f *Firewall) SetPeers(addrs []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn == nil {
		return errors.New("the egress filter is closed")
	}
	var els [2][]nftables.SetElement
	seen := map[netip.Addr]bool{}
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if !a.IsValid() || seen[a] {
			continue
		}
		seen[a] = true
		i := 0
		if a.Is6() {
			i = 1
		}
		els[i] = append(els[i], nftables.SetElement{Key: a.AsSlice()})
	}
	for i, s := range f.peers {
		f.conn.FlushSet(s)
		if len(els[i]) > 0 {
			if err := f.conn.SetAddElements(s, els[i]); err != nil {
				return err
			}
		}
	}
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("setting the mesh peers in the egress filter: %v", err)
	}
	return nil
}

// Close removes the table. Idempotent.
func (f *Firewall) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn == nil {
		return nil
	}
	f.conn.DelTable(f.table)
	err := f.conn.Flush()
	f.conn.CloseLasting()
	f.conn = nil
	if err != nil {
		return fmt.Errorf("removing the egress filter %s: %v", f.name, err)
	}
	return nil
}

// ReadResolvers returns the nameservers of a resolv.conf file, or the loopback
// addresses glibc and Go use when it names none (or does not exist).
func ReadResolvers(path string) ([]netip.Addr, error) {
	fallback := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}
	fh, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fallback, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the resolvers: %v", err)
	}
	defer fh.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil {
			continue
		}
		a = a.Unmap().WithZone("")
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the resolvers: %v", err)
	}
	if len(out) == 0 {
		return fallback, nil
	}
	return out, nil
}
