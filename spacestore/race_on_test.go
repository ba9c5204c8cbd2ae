//go:build race

package spacestore

// raceOn: under -race a sync.Pool drops a random share of what is put back, so
// allocation counts say nothing about pooling.
const raceOn = true
