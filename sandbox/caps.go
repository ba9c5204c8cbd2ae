package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Cap is a Linux capability number (capabilities(7)).
type Cap uint

// The capabilities an isolating box uses.
const (
	CapChown       Cap = unix.CAP_CHOWN        // hand the restored data dir and the socket dir to the space's uid
	CapDacOverride Cap = unix.CAP_DAC_OVERRIDE // checkpoint, restore and remove data dirs owned by the space's uid; dial its socket
	CapFowner      Cap = unix.CAP_FOWNER       // hard-link the space's socket into the box's proxy directory (protected_hardlinks)
	CapKill        Cap = unix.CAP_KILL         // send the stop signal to a process of another uid
	CapSetGID      Cap = unix.CAP_SETGID       // start the instance with the space's gid and no supplementary groups
	CapSetUID      Cap = unix.CAP_SETUID       // start the instance with the space's uid
	CapNetAdmin    Cap = unix.CAP_NET_ADMIN    // network egress: install the box's nftables table
	CapSysAdmin    Cap = unix.CAP_SYS_ADMIN    // network none: start the instance in a network namespace of its own
)

// IsolationCaps are the capabilities a box needs to run isolated spaces.
var IsolationCaps = []Cap{CapSetUID, CapSetGID, CapChown, CapDacOverride, CapFowner, CapKill}

var capNames = map[Cap]string{
	CapChown:       "CAP_CHOWN",
	CapDacOverride: "CAP_DAC_OVERRIDE",
	CapFowner:      "CAP_FOWNER",
	CapKill:        "CAP_KILL",
	CapSetGID:      "CAP_SETGID",
	CapSetUID:      "CAP_SETUID",
	CapNetAdmin:    "CAP_NET_ADMIN",
	CapSysAdmin:    "CAP_SYS_ADMIN",
}

func (c Cap) String() string {
	if n, ok := capNames[c]; ok {
		return n
	}
	return "CAP_" + strconv.Itoa(int(c))
}

// EffectiveCaps reads this process's effective capability set from /proc/self/status.
func EffectiveCaps() (uint64, error) {
	return procCaps("/proc/self/status", "CapEff:")
}

func procCaps(path, field string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s line in %s", field, path)
}

// MissingCaps returns the capabilities of want that this process does not hold in its
// effective set, in the order given.
func MissingCaps(want ...Cap) ([]Cap, error) {
	eff, err := EffectiveCaps()
	if err != nil {
		return nil, fmt.Errorf("reading capabilities: %v", err)
	}
	return missingFrom(eff, want), nil
}

func missingFrom(eff uint64, want []Cap) []Cap {
	var out []Cap
	for _, c := range want {
		if eff&(1<<c) == 0 {
			out = append(out, c)
		}
	}
	return out
}

// CheckIsolationCaps returns an error naming every capability the box lacks to run
// isolated spaces, or nil.
func CheckIsolationCaps() error {
	missing, err := MissingCaps(IsolationCaps...)
	if err != nil {
		return err
	}
	if len(missing) == 0 {
		return nil
	}
	names := make([]string, len(missing))
	for i, c := range missing {
		names[i] = c.String()
	}
	return fmt.Errorf("isolation needs %s, which this box lacks (grant them with AmbientCapabilities= in the systemd unit, run as root, or set isolation none)", strings.Join(names, ", "))
}

// requireCap returns an error saying what needs c (the message names it) when this
// process lacks c in its effective set.
func requireCap(c Cap, msg string) error {
	missing, err := MissingCaps(c)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return errors.New(msg)
	}
	return nil
}
