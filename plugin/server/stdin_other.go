//go:build !linux

package server

import "errors"

// detachStdin is unimplemented off Linux: the plugin refuses to run rather
// than keep the host's ACP stream as its stdin.
func detachStdin() error { return errors.New("detach stdin: unimplemented on this platform") }
