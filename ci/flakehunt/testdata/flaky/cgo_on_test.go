//go:build cgo

package flaky

const builtWithCgo = "1"
