package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCA is a throwaway CA and one wildcard leaf for *.<domain> and <domain>, valid also
// for the loopback IPs 127.0.0.1-5 that mesh test boxes use in their SELF URLs, written as
// PEM files in a directory.
type TestCA struct {
	Pool                      *x509.CertPool
	CAFile, CertFile, KeyFile string
}

// NewTestCA makes a TestCA for domain (and the more domains) in dir.
func NewTestCA(t testing.TB, dir, domain string, more ...string) *TestCA {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lchat mesh test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "*." + domain},
		DNSNames:     dnsNames(domain, more),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("127.0.0.2"), net.ParseIP("127.0.0.3"), net.ParseIP("127.0.0.4"), net.ParseIP("127.0.0.5")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(leafKey)
	ca := &TestCA{
		Pool:     x509.NewCertPool(),
		CAFile:   filepath.Join(dir, "ca.pem"),
		CertFile: filepath.Join(dir, "leaf.pem"),
		KeyFile:  filepath.Join(dir, "leaf-key.pem"),
	}
	ca.Pool.AddCert(caCert)
	write := func(p, typ string, der []byte) {
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(ca.CAFile, "CERTIFICATE", caDER)
	write(ca.CertFile, "CERTIFICATE", leafDER)
	write(ca.KeyFile, "EC PRIVATE KEY", keyDER)
	return ca
}

// dnsNames is each domain and its wildcard.
func dnsNames(domain string, more []string) []string {
	var out []string
	for _, d := range append([]string{domain}, more...) {
		out = append(out, "*."+d, d)
	}
	return out
}
