package ckptbench

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// s3Link stands in for the network between a box and S3: each connection gets at most rate
// bytes per second towards the client, and each response's first byte waits latency after
// its request. Parallel GETs then pay off as they do against S3 (one stream is limited, many
// are not), which a local versitygw on a loaded two-core machine cannot show.
type s3Link struct {
	ln      net.Listener
	target  string
	rate    float64
	latency time.Duration
	wg      sync.WaitGroup
}

func startLink(t *testing.T, target string, rate float64, latency time.Duration) *s3Link {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &s3Link{ln: ln, target: target, rate: rate, latency: latency}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.wg.Add(1)
			go l.handle(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return l
}

func (l *s3Link) handle(c net.Conn) {
	defer l.wg.Done()
	defer c.Close()
	s, err := net.Dial("tcp", l.target)
	if err != nil {
		return
	}
	defer s.Close()
	var requested atomic.Int64 // unix nanos of a request not yet answered
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				requested.CompareAndSwap(0, time.Now().UnixNano())
				if _, werr := s.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				s.(*net.TCPConn).CloseWrite()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	var start time.Time
	var sent int64
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if at := requested.Swap(0); at != 0 {
				time.Sleep(time.Until(time.Unix(0, at).Add(l.latency)))
				start, sent = time.Now(), 0
			}
			sent += int64(n)
			time.Sleep(time.Until(start.Add(time.Duration(float64(sent) / l.rate * float64(time.Second)))))
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}
