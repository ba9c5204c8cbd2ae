package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPrivateTmpHidesTheBoxesTmp starts two instances with StartOptions.TmpDir, each its
// own directory: neither sees a file the box put in its /tmp, nor the other's file; what
// each writes to /tmp and /var/tmp lands in its own directory, not in the box's /tmp; and
// /tmp is nosuid,nodev.
func TestPrivateTmpHidesTheBoxesTmp(t *testing.T) {
	c := rootCgroups(t)
	if err := CheckPrivateTmp(); err != nil {
		t.Fatal(err)
	}
	mark := "lchat-tmp-test-" + strings.ReplaceAll(t.Name(), "/", "_") + "-" + time.Now().Format("150405.000000000")
	boxFile := filepath.Join("/tmp", mark+".box")
	if err := os.WriteFile(boxFile, []byte("box"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(boxFile)
	root := t.TempDir()
	os.Chmod(root, 0o711)
	run := func(name string, uid uint32) (tmp, out string) {
		tmp = filepath.Join(root, name)
		if err := PrepareTmpDir(tmp, uid, uid); err != nil {
			t.Fatal(err)
		}
		g, err := c.Create("tmp."+name, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Remove()
		cmd := exec.Command("/bin/sh", "-c", `ls -a /tmp; echo `+name+` > /tmp/`+mark+`.`+name+`; echo v > /var/tmp/`+mark+`.var; ls /tmp; grep -E ' /tmp | /var/tmp ' /proc/self/mountinfo`)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
		var b strings.Builder
		cmd.Stdout, cmd.Stderr = &b, &b
		release, err := g.Start(cmd, StartOptions{TmpDir: tmp})
		if err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		release()
		if err != nil {
			t.Fatalf("instance %s: %v\n%s", name, err, b.String())
		}
		return tmp, b.String()
	}
	tmpA, outA := run("a", 3999950)
	tmpB, outB := run("b", 3999951)
	t.Logf("a sees:\n%s\nb sees:\n%s", outA, outB)
	for name, out := range map[string]string{"a": outA, "b": outB} {
		if strings.Contains(out, mark+".box") {
			t.Errorf("instance %s sees the box's /tmp", name)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, " /tmp ") || strings.Contains(l, " /var/tmp ") {
				if !strings.Contains(l, "nosuid") || !strings.Contains(l, "nodev") {
					t.Errorf("instance %s: %s, want nosuid,nodev", name, l)
				}
			}
		}
	}
	if strings.Contains(outB, mark+".a") {
		t.Error("instance b sees a's /tmp")
	}
	for name, tmp := range map[string]string{"a": tmpA, "b": tmpB} {
		if b, err := os.ReadFile(filepath.Join(tmp, mark+"."+name)); err != nil || strings.TrimSpace(string(b)) != name {
			t.Errorf("instance %s's /tmp file not in its own tmp dir: %q, %v", name, b, err)
		}
		if _, err := os.Stat(filepath.Join(tmp, mark+".var")); err != nil {
			t.Errorf("instance %s's /var/tmp is not its tmp dir: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join("/tmp", mark+"."+name)); err == nil {
			t.Errorf("instance %s wrote into the box's /tmp", name)
			os.Remove(filepath.Join("/tmp", mark+"."+name))
		}
	}
	// The next start begins with an empty /tmp.
	if err := PrepareTmpDir(tmpA, 3999950, 3999950); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(tmpA); len(ents) != 0 {
		t.Errorf("tmp dir not emptied for the next start: %v", ents)
	}
}

// BenchmarkStartPrivateTmp measures what a private /tmp adds to a start: /bin/true
// started into a group, forked and reaped, with and without StartOptions.TmpDir.
// go test ./sandbox -run '^$' -bench StartPrivateTmp (root).
func BenchmarkStartPrivateTmp(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (CI runs as root)")
	}
	c, err := OpenCgroups()
	if err != nil {
		b.Skip(err)
	}
	defer c.Close()
	if err := CheckPrivateTmp(); err != nil {
		b.Fatal(err)
	}
	tmp := b.TempDir()
	for _, bc := range []struct {
		name string
		opt  StartOptions
	}{{"box-tmp", StartOptions{}}, {"private-tmp", StartOptions{TmpDir: tmp}}} {
		b.Run(bc.name, func(b *testing.B) {
			g, err := c.Create("bench.tmp", Limits{})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Remove()
			for b.Loop() {
				cmd := exec.Command("/bin/true")
				release, err := g.Start(cmd, bc.opt)
				if err != nil {
					b.Fatal(err)
				}
				cmd.Wait()
				release()
			}
		})
	}
}
