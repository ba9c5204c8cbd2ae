package harness

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/lchat/lchat-caddy/internal/testwait"
)

// ACME is a running pebble (the ACME test CA) and pebble-challtestsrv (the DNS
// server pebble validates against), both on 127.0.0.1, plus a tiny authoritative
// DNS server that answers SOA queries for the test zones, which certmagic needs
// to find a record's zone and challtestsrv does not answer.
type ACME struct {
	// Directory is the ACME directory URL, https://127.0.0.1:<port>/dir.
	Directory string
	// ServerCAFile is a PEM file with the CA of pebble's own HTTPS certificate: an
	// ACME client must trust it to talk to Directory (caddy: trusted_roots).
	ServerCAFile string
	// RootPEM is the root pebble issues certificates under (from /roots/0): a TLS
	// client of a box trusts it.
	RootPEM []byte
	// ChallSrvURL is challtestsrv's management API, http://127.0.0.1:<port>.
	ChallSrvURL string
	// ChallSrvDNS is challtestsrv's DNS address (UDP and TCP), which pebble uses.
	ChallSrvDNS string
	// SOAResolver is the address of the SOA server, to pass as the DNS challenge's
	// resolver (caddy: resolvers) so the zone of _acme-challenge.<domain> is found.
	SOAResolver string
	// PebbleLog and ChallSrvLog receive the servers' output.
	PebbleLog, ChallSrvLog string

	mgmt string // pebble's management address
}

// StartACME starts challtestsrv, the SOA server for zones (e.g. "mesh.test") and
// pebble resolving through challtestsrv, waits until they answer, and stops them
// when the test ends. Pebble runs with PEBBLE_VA_NOSLEEP=1 and
// PEBBLE_WFE_NONCEREJECT=0, so issuance takes well under a second.
func StartACME(t testing.TB, zones ...string) *ACME {
	t.Helper()
	pebbleBin := Tool(t, "pebble")
	challBin := Tool(t, "pebble-challtestsrv")
	dir := t.TempDir()
	a := &ACME{
		PebbleLog:   filepath.Join(dir, "pebble.log"),
		ChallSrvLog: filepath.Join(dir, "challtestsrv.log"),
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pebble log tail:\n%s", tail(a.PebbleLog, 40))
			t.Logf("challtestsrv log tail:\n%s", tail(a.ChallSrvLog, 20))
		}
	})

	a.SOAResolver = startSOAServer(t, zones)

	startChallSrv(t, a, challBin)

	caPEM, certFile, keyFile := pebbleServerCert(t, dir)
	a.ServerCAFile = filepath.Join(dir, "pebble-server-ca.pem")
	if err := os.WriteFile(a.ServerCAFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	// Both ports stay reserved until the test ends (FreePort): no other process can take
	// them before pebble binds them.
	listen, mgmt := FreeAddr(t, "127.0.0.1"), FreeAddr(t, "127.0.0.1")
	a.Directory, a.mgmt = "https://"+listen+"/dir", mgmt
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress":                  listen,
		"managementListenAddress":        mgmt,
		"certificate":                    certFile,
		"privateKey":                     keyFile,
		"httpPort":                       5002,
		"tlsPort":                        5001,
		"ocspResponderURL":               "",
		"externalAccountBindingRequired": false,
		"retryAfter":                     map[string]int{"authz": 1, "order": 1},
	}}
	cfgFile := filepath.Join(dir, "pebble-config.json")
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(cfgFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	stop, err := startProcess(a.PebbleLog, []string{"PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0"},
		pebbleBin, "-config", cfgFile, "-dnsserver", a.ChallSrvDNS)
	t.Cleanup(stop)
	if err == nil {
		err = waitHTTP(func() error {
			resp, err := client.Get(a.Directory)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("directory: %s", resp.Status)
			}
			return nil
		})
	}
	if err != nil {
		t.Fatalf("starting pebble: %v\n%s", err, tail(a.PebbleLog, 40))
	}

	resp, err := client.Get("https://" + a.mgmt + "/roots/0")
	if err != nil {
		t.Fatalf("fetching pebble's root: %v", err)
	}
	defer resp.Body.Close()
	a.RootPEM, err = io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("fetching pebble's root: %s %v", resp.Status, err)
	}
	return a
}

// RootPool returns a pool holding pebble's issuing root.
func (a *ACME) RootPool(t testing.TB) *x509.CertPool {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(a.RootPEM) {
		t.Fatalf("pebble's root is not PEM: %q", a.RootPEM)
	}
	return pool
}

// Orders counts the orders pebble has created so far (from its log).
func (a *ACME) Orders(t testing.TB) int {
	b, err := os.ReadFile(a.PebbleLog)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "Added order ")
}

// startProcess starts bin in its own process group with output to logFile and
// returns a function that kills the group and waits.
func startProcess(logFile string, env []string, bin string, args ...string) (stop func(), err error) {
	logf, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return func() {}, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return func() {}, err
	}
	var exited atomic.Bool
	done := make(chan struct{})
	go func() { cmd.Wait(); exited.Store(true); close(done) }()
	stop = func() {
		if !exited.Load() {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
	// Give a process that fails at once (a taken port) the chance to be noticed.
	select {
	case <-done:
		return stop, fmt.Errorf("%s exited at start", filepath.Base(bin))
	case <-time.After(50 * time.Millisecond):
	}
	return stop, nil
}

// waitHTTP retries probe on WaitFor's curve for up to 20s, and returns its last error
// (nil once it succeeded); a backoffStop ends the wait at once with the error it wraps.
func waitHTTP(probe func() error) error {
	var err error
	testwait.Poll(20*time.Second, func() bool {
		err = probe()
		var stop backoffStop
		if errors.As(err, &stop) {
			err = stop.err
			return true
		}
		return err == nil
	})
	return err
}

// startChallSrv starts pebble-challtestsrv: its management API on a reserved port
// (FreePort), its DNS server on UDP and TCP on one port. The TCP side is reserved too; the
// UDP side cannot be (challtestsrv's UDP socket sets no SO_REUSEADDR, so a reservation would
// block it), so another process may have been given that UDP port: then, and only then (its
// log says so), it is started again on a fresh port.
func startChallSrv(t testing.TB, a *ACME, bin string) {
	t.Helper()
	for try := 1; ; try++ {
		mgmt, dnsAddr := FreeAddr(t, "127.0.0.1"), freeAddrTCP(t, "127.0.0.1")
		a.ChallSrvURL, a.ChallSrvDNS = "http://"+mgmt, dnsAddr
		logStart := logSize(a.ChallSrvLog)
		stop, err := startProcess(a.ChallSrvLog, nil, bin,
			"-management", mgmt, "-dnsserver", dnsAddr,
			"-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", "", "-defaultIPv6", "")
		if err == nil {
			err = waitHTTP(func() error {
				resp, err := http.Post(a.ChallSrvURL+"/set-default-ipv4", "application/json", strings.NewReader(`{"ip":"127.0.0.1"}`))
				if err == nil {
					resp.Body.Close()
				}
				return err
			})
		}
		if err == nil {
			// The DNS server answers once both its sockets are bound; a bind that failed is
			// only logged.
			err = waitHTTP(func() error { return probeDNS(dnsAddr, a.ChallSrvLog, logStart) })
		}
		if err == nil {
			t.Cleanup(stop)
			return
		}
		stop()
		if !errors.Is(err, errUDPPortTaken) || try == 5 {
			t.Fatalf("starting pebble-challtestsrv: %v\n%s", err, tail(a.ChallSrvLog, 20))
		}
		t.Logf("pebble-challtestsrv: UDP %s was taken by another process; starting it on another port", dnsAddr)
	}
}

// errUDPPortTaken is challtestsrv's UDP DNS socket failing to bind its port.
var errUDPPortTaken = errors.New("UDP port taken")

// probeDNS asks the DNS server at addr over UDP and TCP; when its log (past from) shows
// that its UDP bind failed, it says so with errUDPPortTaken.
func probeDNS(addr, logFile string, from int64) error {
	if b, err := os.ReadFile(logFile); err == nil && int64(len(b)) >= from {
		if bindFailed(string(b[from:]), "udp", addr) {
			return backoffStop{errUDPPortTaken}
		}
	}
	for _, netw := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: netw, Timeout: time.Second}
		m := new(dns.Msg)
		m.SetQuestion("probe.lchat.test.", dns.TypeA)
		if _, _, err := c.Exchange(m, addr); err != nil {
			return fmt.Errorf("DNS over %s at %s: %v", netw, addr, err)
		}
	}
	return nil
}

// bindFailed reports whether log holds Go's error for a failed bind of addr on netw
// ("listen udp 127.0.0.1:5353: bind: address already in use").
func bindFailed(log, netw, addr string) bool {
	return strings.Contains(log, "listen "+netw+" "+addr+": bind: address already in use")
}

// backoffStop ends waitHTTP at once with its error.
type backoffStop struct{ err error }

func (b backoffStop) Error() string { return b.err.Error() }
func (b backoffStop) Unwrap() error { return b.err }

func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// startSOAServer answers SOA queries for each zone apex authoritatively, and with an
// empty NOERROR for names below a zone, the way a real authoritative server does, so
// certmagic's zone lookup walks up to the apex. It serves UDP on 127.0.0.1.
func startSOAServer(t testing.TB, zones []string) string {
	apex := map[string]bool{}
	for _, z := range zones {
		apex[dns.Fqdn(strings.ToLower(z))] = true
	}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		for _, q := range r.Question {
			name := strings.ToLower(q.Name)
			var zone string
			for z := range apex {
				if name == z || strings.HasSuffix(name, "."+z) {
					zone = z
				}
			}
			if zone == "" {
				m.Rcode = dns.RcodeNameError
				continue
			}
			soa := &dns.SOA{Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 60},
				Ns: "ns." + zone, Mbox: "hostmaster." + zone, Serial: 1, Refresh: 60, Retry: 60, Expire: 60, Minttl: 1}
			if q.Qtype == dns.TypeSOA && name == zone {
				m.Answer = append(m.Answer, soa)
			} else {
				m.Ns = append(m.Ns, soa)
			}
		}
		_ = w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: handler}
	go srv.ActivateAndServe()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.ShutdownContext(ctx)
	})
	return pc.LocalAddr().String()
}

// pebbleServerCert makes a CA and a certificate for 127.0.0.1 and localhost signed
// by it, for pebble's HTTPS listeners, and returns the CA PEM and the file paths.
func pebbleServerCert(t testing.TB, dir string) (caPEM []byte, certFile, keyFile string) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "lchat test pebble server CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "pebble-server.pem"), filepath.Join(dir, "pebble-server.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), certFile, keyFile
}
