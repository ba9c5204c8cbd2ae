package safego

import (
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestPanicIsLoggedNotFatal(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	var wg sync.WaitGroup
	Go(&wg, zap.New(core), "boom", func() { panic("bad space") })
	wg.Wait()
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d log entries, want 1", len(entries))
	}
	f := entries[0].ContextMap()
	if f["goroutine"] != "boom" || f["panic"] != "bad space" || f["stack"] == "" {
		t.Fatalf("logged %v", f)
	}
}

func TestRunReturnsThePanic(t *testing.T) {
	if p := Run(zap.NewNop(), "ok", func() {}); p != nil {
		t.Fatalf("Run of a normal f = %v", p)
	}
	if p := Run(nil, "bad", func() { panic(42) }); p != 42 {
		t.Fatalf("Run = %v, want 42", p)
	}
}
