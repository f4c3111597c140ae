package vmguest

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// screenTTY is the display's console: fbcon draws tty1 on the
// framebuffer the bochs module brings up.
const screenTTY = "/dev/tty1"

// screenBanner is what the display shows once the agent runs.
func screenBanner(hostname string) string {
	return fmt.Sprintf("\x1b[2J\x1b[H%s: tether VM computer\r\n\r\n"+
		"This screen is the computer's display. Keys typed here echo on it\r\n"+
		"and go nowhere else: no shell or login runs on this console.\r\n\r\n", hostname)
}

// startScreen writes the banner on tty1 and then reads tty1 forever,
// discarding what it reads (the terminal's own echo draws typed keys).
// The console is opened without becoming the agent's controlling
// terminal, so no key sends PID 1 a signal. A missing tty1 is noted on
// the console and leaves the display blank; the computer still works.
func startScreen(hostname string, console io.Writer) {
	go func() {
		f, err := openTTY(screenTTY, 10*time.Second)
		if err != nil {
			fmt.Fprintf(console, "tether-vmguest: screen: %v\n", err)
			return
		}
		defer f.Close()
		if _, err := io.WriteString(f, screenBanner(hostname)); err != nil {
			fmt.Fprintf(console, "tether-vmguest: screen: %v\n", err)
			return
		}
		_, _ = io.Copy(io.Discard, f)
	}()
}

// openTTY opens path read-write with O_NOCTTY once it exists.
func openTTY(path string, wait time.Duration) (*os.File, error) {
	deadline := time.Now().Add(wait)
	for {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err == nil {
			return os.NewFile(uintptr(fd), path), nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
