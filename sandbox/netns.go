package sandbox

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// enterEmptyNetwork moves the calling thread, which must be locked to its goroutine and
// must never run other Go code again, into a new network namespace whose only interface
// is the loopback, brought up. A process forked from the thread starts inside: it
// reaches its own 127.0.0.1 and ::1 and nothing else (ENETUNREACH), while a Unix socket
// with a filesystem path stays reachable from the box.
func enterEmptyNetwork() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unsharing the network namespace: %v", err)
	}
	return loopbackUp()
}

// loopbackUp sets the IFF_UP flag of lo in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bringing lo up: %v", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %v", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %v", err)
	}
	return nil
}

// CheckEmptyNetwork reports whether this box can start instances in a network namespace
// of their own (network none): it needs CAP_SYS_ADMIN, and no seccomp filter or systemd
// RestrictNamespaces= may forbid the namespace. It tries once, on a thread that ends
// afterwards.
func CheckEmptyNetwork() error {
	if err := requireCap(CapSysAdmin, "network none needs CAP_SYS_ADMIN, which this box lacks (grant it with AmbientCapabilities= and allow the namespace with RestrictNamespaces=net in the systemd unit, run as root, or set network egress)"); err != nil {
		return err
	}
	res := make(chan error, 1)
	// The thread, now in the probe's namespace, ends with the goroutine.
	onOwnThread(func() { res <- enterEmptyNetwork() })
	if err := <-res; err != nil {
		return fmt.Errorf("network none: %v (under systemd, RestrictNamespaces= must allow net)", err)
	}
	return nil
}
