package testnet

import (
	"encoding/binary"
	"io"

	"net/netip"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// serveDNS answers A queries for DNSNames over UDP and TCP at addr, in ns.
func serveDNS(t testing.TB, ns *NS, addr netip.AddrPort) {
	t.Helper()
	pc, err := ns.ListenPacket("udp", addr.String())
	if err != nil {
		t.Fatalf("listening for DNS on udp %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { pc.Close() })
	l, err := ns.Listen("tcp", addr.String())
	if err != nil {
		t.Fatalf("listening for DNS on tcp %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out, ok := dnsAnswer(buf[:n]); ok {
				pc.WriteTo(out, from)
			}
		}
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var n uint16
				if binary.Read(c, binary.BigEndian, &n) != nil {
					return
				}
				q := make([]byte, n)
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				if out, ok := dnsAnswer(q); ok {
					binary.Write(c, binary.BigEndian, uint16(len(out)))
					c.Write(out)
				}
			}()
		}
	}()
}

// dnsAnswer is the response to one query: the A record of a name in DNSNames, an empty
// answer for its other types, NXDOMAIN for any other name.
func dnsAnswer(q []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil, false
	}
	question, err := p.Question()
	if err != nil {
		return nil, false
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionAvailable: true}
	a, known := DNSNames[question.Name.String()]
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	b.StartQuestions()
	b.Question(question)
	b.StartAnswers()
	if known && question.Type == dnsmessage.TypeA {
		b.AResource(dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 60},
			dnsmessage.AResource{A: a.As4()})
	}
	out, err := b.Finish()
	return out, err == nil
}
