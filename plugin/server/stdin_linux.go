package server

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// detachStdin points fd 0 at /dev/null. go-plugin starts the plugin with the
// host's stdin, which for an ACP agent is the ACP stream itself; the plugin
// must never be able to read from it.
func detachStdin() error {
	f, err := os.Open(os.DevNull)
	if err != nil {
		return fmt.Errorf("detach stdin: %w", err)
	}
	defer f.Close()
	if err := unix.Dup3(int(f.Fd()), 0, 0); err != nil {
		return fmt.Errorf("detach stdin: dup3: %w", err)
	}
	return nil
}
