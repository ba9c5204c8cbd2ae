//go:build !race

package spacestore

const raceOn = false
