package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MintHost names the space of id: <base36(id)>.<domain>, the label the seed's hostnames
// use (id 10000 is 7ps.example.com). domain is a wildcard domain, with or without its
// leading "*.".
func MintHost(id uint64, domain string) (string, error) {
	domain = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(domain)), "*.")
	if id == 0 {
		return "", errors.New("ledger: id 0 is never handed out")
	}
	if domain == "" {
		return "", errors.New("ledger: no domain to mint a host under")
	}
	return strconv.FormatUint(id, 36) + "." + domain, nil
}

// ErrTaken is what a Minter's claim returns for a host that already has a route: the
// minter draws the next id.
var ErrTaken = errors.New("ledger: host already taken")

// maxMintTries bounds how many taken hosts one Mint skips: ids below a ledger's seed may
// already name routes, and a seed well above them makes this rare.
const maxMintTries = 100

// IDSource hands out ids that no other caller on the same source gets (an Allocator).
type IDSource interface {
	Next(ctx context.Context) (uint64, error)
}

// Mint draws ids from src until claim accepts the host <base36(id)>.<domain>: claim
// creates the route and returns ErrTaken when the host already has one. Two boxes on one
// ledger never draw the same id, so they never claim the same host.
func Mint(ctx context.Context, src IDSource, domain string, claim func(host string) error) (host string, id uint64, err error) {
	for range maxMintTries {
		id, err = src.Next(ctx)
		if err != nil {
			return "", 0, fmt.Errorf("allocating an id: %v", err)
		}
		host, err = MintHost(id, domain)
		if err != nil {
			return "", 0, err
		}
		err = claim(host)
		if errors.Is(err, ErrTaken) {
			continue
		}
		if err != nil {
			return "", 0, err
		}
		return host, id, nil
	}
	return "", 0, fmt.Errorf("ledger: %d minted hosts in a row were taken; seed the ledger above the ids in use", maxMintTries)
}
