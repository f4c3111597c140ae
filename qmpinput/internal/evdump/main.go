// Command evdump runs inside the qmpinput test guest: it opens every
// /dev/input/event* device (rescanning, since USB devices appear late) and
// prints each key, button, relative-axis (wheel) and absolute-axis event it reads to stdout, one
// line per event:
//
//	evdump: open event2 name="QEMU QEMU USB Tablet"
//	evdump: event2 type=3 code=0 value=16383
//
// It is a test fixture; the host side parses these lines.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// inputEvent is struct input_event on 64-bit Linux: timeval, type, code, value.
type inputEvent struct {
	Sec, Usec int64
	Type      uint16
	Code      uint16
	Value     int32
}

const (
	evKey = 1
	evRel = 2
	evAbs = 3
)

var out sync.Mutex

func main() {
	seen := map[string]bool{}
	for {
		paths, _ := filepath.Glob("/dev/input/event*")
		for _, p := range paths {
			if !seen[p] {
				seen[p] = true
				go dump(p)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func dump(path string) {
	dev := filepath.Base(path)
	f, err := os.Open(path)
	if err != nil {
		say("evdump: open %s failed: %v", dev, err)
		return
	}
	name, _ := os.ReadFile("/sys/class/input/" + dev + "/device/name")
	say("evdump: open %s name=%q", dev, strings.TrimSpace(string(name)))
	for {
		var ev inputEvent
		if err := binary.Read(f, binary.LittleEndian, &ev); err != nil {
			say("evdump: %s read: %v", dev, err)
			return
		}
		if ev.Type == evKey || ev.Type == evRel || ev.Type == evAbs {
			say("evdump: %s type=%d code=%d value=%d", dev, ev.Type, ev.Code, ev.Value)
		}
	}
}

func say(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf(format+"\n", args...)
}
