// Command vmagent runs inside the deployment test's VM (tests/deploy); the image starts
// it at boot from the payload disk (/srv/payload/vmagent serve).
//
//	vmagent serve              POST /exec {"script": "..."} runs the script with /bin/sh as
//	                           root and answers {"out": combined output, "code": exit code};
//	                           GET /boot answers the boot id. Requests carry the token of
//	                           /srv/payload/token in X-Token. Listens on :8022, which only
//	                           the test's own QEMU forward reaches (127.0.0.1 on the host).
//	vmagent soa <addr> <zone>  a DNS server on addr (UDP) answering SOA for zone, which
//	                           certmagic needs to find the zone of _acme-challenge.<name>
//	                           and pebble-challtestsrv does not answer (as tests/harness).
package main

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/miekg/dns"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: vmagent serve | vmagent soa <addr> <zone>")
	}
	switch os.Args[1] {
	case "serve":
		serve()
	case "soa":
		if len(os.Args) != 4 {
			log.Fatal("usage: vmagent soa <addr> <zone>")
		}
		soa(os.Args[2], os.Args[3])
	default:
		log.Fatalf("unknown command %s", os.Args[1])
	}
}

type execRequest struct {
	Script  string `json:"script"`
	Timeout int    `json:"timeout_s"`
}

type execResult struct {
	Out  string `json:"out"`
	Code int    `json:"code"`
}

func serve() {
	tok, err := os.ReadFile("/srv/payload/token")
	if err != nil {
		log.Fatalf("reading token: %v", err)
	}
	token := strings.TrimSpace(string(tok))
	auth := func(r *http.Request) bool {
		return subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Token")), []byte(token)) == 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /boot", func(w http.ResponseWriter, r *http.Request) {
		if !auth(r) {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
		w.Write(bytes.TrimSpace(b))
	})
	mux.HandleFunc("POST /exec", func(w http.ResponseWriter, r *http.Request) {
		if !auth(r) {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		var req execRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if req.Timeout <= 0 {
			req.Timeout = 300
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Duration(req.Timeout)*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", req.Script)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
		cmd.WaitDelay = 5 * time.Second
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		res := execResult{Out: out.String()}
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			res.Code = ee.ExitCode()
		default:
			res.Code = -1
			res.Out += fmt.Sprintf("\nvmagent: %v", err)
		}
		if ctx.Err() != nil {
			res.Out += fmt.Sprintf("\nvmagent: timed out after %ds", req.Timeout)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(res)
	})
	log.Fatal(http.ListenAndServe(":8022", mux))
}

func soa(addr, zone string) {
	zone = dns.Fqdn(strings.ToLower(zone))
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		for _, q := range r.Question {
			name := strings.ToLower(q.Name)
			if name != zone && !strings.HasSuffix(name, "."+zone) {
				m.Rcode = dns.RcodeNameError
				continue
			}
			rr := &dns.SOA{Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 60},
				Ns: "ns." + zone, Mbox: "hostmaster." + zone, Serial: 1, Refresh: 60, Retry: 60, Expire: 60, Minttl: 1}
			if q.Qtype == dns.TypeSOA && name == zone {
				m.Answer = append(m.Answer, rr)
			} else {
				m.Ns = append(m.Ns, rr)
			}
		}
		_ = w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal((&dns.Server{PacketConn: pc, Handler: handler}).ActivateAndServe())
}
