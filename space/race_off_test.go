//go:build !race

package space

const raceOn = false
