//go:build !linux

package host

import "os"

// sealedCopy returns ErrUnimplemented: the plugin runs only from a sealed
// memfd (exe_linux.go), which only Linux has, and this package never runs
// bytes other than the ones it hashed. So Load fails before it starts
// anything, and no Plugin or Conn can exist here; the rest of the package
// builds and behaves as on Linux.
func sealedCopy(string, []byte) (*os.File, error) { return nil, ErrUnimplemented }

// execPath is never reached: sealedCopy always fails.
func execPath(*os.File) string { return "" }
