package qmpinput

import (
	"bufio"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// fakeQMP is a scripted QMP peer on a unix socket, for what real QEMU
// cannot be made to do: malformed greetings, event floods, wrong reply
// ids, silence. It records every command it receives and fails the test on
// a command its handler does not expect (handler returns nil lines).
type fakeQMP struct {
	t        *testing.T
	path     string
	greeting string
	// handle answers one command (after qmp_capabilities) with raw lines.
	handle func(cmd fakeCmd) []string
	mu     sync.Mutex
	got    []fakeCmd
	ln     net.Listener
	wg     sync.WaitGroup
}

type fakeCmd struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        uint64          `json:"id"`
}

const greeting72 = `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": "fake"}, "capabilities": ["oob"]}}`

// newFakeQMP listens in a fresh 0700 directory; serve must be called.
func newFakeQMP(t *testing.T) *fakeQMP {
	dir, err := os.MkdirTemp("", "fakeqmp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeQMP{t: t, path: filepath.Join(dir, "qmp.sock"), greeting: greeting72}
	f.handle = f.okScreendumpAndInput
	ln, err := net.Listen("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(f.path, 0o700)
	f.ln = ln
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	f.wg.Add(1)
	go f.serve()
	return f
}

func (f *fakeQMP) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() { defer f.wg.Done(); f.session(c) }()
	}
}

func (f *fakeQMP) session(c net.Conn) {
	defer c.Close()
	f.mu.Lock()
	g := f.greeting
	f.mu.Unlock()
	fmt.Fprintf(c, "%s\r\n", g)
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		var cmd fakeCmd
		if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
			f.t.Errorf("fake qmp: malformed command %q", sc.Bytes())
			return
		}
		f.mu.Lock()
		f.got = append(f.got, cmd)
		handle := f.handle
		f.mu.Unlock()
		var lines []string
		if cmd.Execute == "qmp_capabilities" {
			lines = []string{fmt.Sprintf(`{"return": {}, "id": %d}`, cmd.ID)}
		} else {
			lines = handle(cmd)
		}
		if lines == nil {
			f.t.Errorf("fake qmp: unexpected command %s %s", cmd.Execute, cmd.Arguments)
			return
		}
		for _, l := range lines {
			if _, err := fmt.Fprintf(c, "%s\r\n", l); err != nil {
				return
			}
		}
	}
}

func (f *fakeQMP) setHandler(h func(fakeCmd) []string) {
	f.mu.Lock()
	f.handle = h
	f.mu.Unlock()
}

func (f *fakeQMP) setGreeting(g string) {
	f.mu.Lock()
	f.greeting = g
	f.mu.Unlock()
}

func (f *fakeQMP) commands() []fakeCmd {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeCmd(nil), f.got...)
}

// frameColor is what the next fake screendump draws; tests change it.
var fakeFrame = struct {
	sync.Mutex
	w, h int
	c    color.RGBA
}{w: 640, h: 480, c: color.RGBA{10, 20, 30, 255}}

func setFakeFrame(w, h int, c color.RGBA) {
	fakeFrame.Lock()
	fakeFrame.w, fakeFrame.h, fakeFrame.c = w, h, c
	fakeFrame.Unlock()
}

// okScreendumpAndInput answers screendump by writing a real PNG to the
// requested file and input-send-event with success.
func (f *fakeQMP) okScreendumpAndInput(cmd fakeCmd) []string {
	switch cmd.Execute {
	case "screendump":
		var a screendumpArgs
		if err := json.Unmarshal(cmd.Arguments, &a); err != nil || a.Format != "png" {
			f.t.Errorf("fake qmp: bad screendump args %s", cmd.Arguments)
			return nil
		}
		if err := writeFakePNG(a.Filename); err != nil {
			return []string{fmt.Sprintf(`{"error": {"class": "GenericError", "desc": %q}, "id": %d}`, err.Error(), cmd.ID)}
		}
		return []string{fmt.Sprintf(`{"return": {}, "id": %d}`, cmd.ID)}
	case "input-send-event", "stop", "cont":
		return []string{fmt.Sprintf(`{"return": {}, "id": %d}`, cmd.ID)}
	}
	return nil
}

func writeFakePNG(name string) error {
	fakeFrame.Lock()
	w, h, c := fakeFrame.w, fakeFrame.h, fakeFrame.c
	fakeFrame.Unlock()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = c.R, c.G, c.B, c.A
	}
	out, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	return png.Encode(out, img)
}
