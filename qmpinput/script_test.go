package qmpinput

import (
	"bytes"
	"encoding/json"
	"errors"
	"image/color"
	"strings"
	"testing"
	"time"
)

func runLines(t *testing.T, a *Adapter, script string) ([]Result, int) {
	t.Helper()
	acts, err := ParseScript(strings.NewReader(script))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	bad, err := RunScript(ctx5(t), a, acts, &out, 0)
	if err != nil {
		t.Fatal(err)
	}
	var rs []Result
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r Result
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		rs = append(rs, r)
	}
	return rs, bad
}

func TestScriptCoordinateContractAcrossActions(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	setFakeFrame(640, 480, color.RGBA{7, 7, 7, 255})
	rs, bad := runLines(t, a, "# a comment\nclick 5 5\n")
	if bad != 1 || rs[0].Code != "no_capture" {
		t.Fatalf("click before capture: %+v", rs)
	}
	rs, bad = runLines(t, a, "capture\nmove 639 479\nwait 1\nkey ctrl+l\ntype hello world\nscroll 2\ndclick 1 1\nclick 640 10\ntype never\n")
	codes := []string{}
	for _, r := range rs {
		codes = append(codes, r.Action+":"+r.Code)
	}
	want := "capture: move: wait: key: type: scroll: dclick: click:out_of_bounds type:skipped"
	if strings.Join(codes, " ") != want || bad != 2 {
		t.Fatalf("got %v (bad %d), want %s", codes, bad, want)
	}
	if rs[0].Frame == nil || rs[0].Width != 640 || rs[0].Height != 480 || len(rs[0].SHA256) != 64 {
		t.Fatalf("capture line %+v", rs[0])
	}
}

func TestScriptUnsupportedAndMalformed(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	for _, verb := range []string{"exec ls -l", "read /etc/shadow", "write /x y", "clipboard", "paste", "open https://example.com"} {
		rs, bad := runLines(t, a, verb+"\n")
		if bad != 1 || rs[0].Code != "unsupported" {
			t.Errorf("%q: %+v", verb, rs)
		}
	}
	for _, s := range []string{"click 1\n", "capture now\n", "teleport 1 2\n", "wait 999999\n", "scroll x\n", "key\n", "type\n", "click 1 2\nbogus\n"} {
		if _, err := ParseScript(strings.NewReader(s)); !errors.Is(err, ErrScript) {
			t.Errorf("%q: %v, want ErrScript", s, err)
		}
	}
	if len(f.commands()) != 1 {
		t.Fatalf("refused script lines reached QEMU: %v", f.commands())
	}
}

// FuzzParseScript: the parser never panics and every accepted action is
// one of the documented verbs with bounded arguments.
func FuzzParseScript(f *testing.F) {
	f.Add("capture\nclick 10 20\ntype hello world\nkey ctrl+alt+t\nwait 5\nscroll -3\n")
	f.Add("exec rm -rf /\n# c\n\n")
	f.Fuzz(func(t *testing.T, s string) {
		acts, err := ParseScript(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, a := range acts {
			switch a.Verb {
			case "capture", "move", "click", "dclick", "scroll", "key", "type":
			case "wait":
				if a.N < 0 || a.N > int(MaxWait.Milliseconds()) {
					t.Fatalf("wait %d accepted", a.N)
				}
			default:
				if _, ok := unsupportedVerbs[a.Verb]; !ok {
					t.Fatalf("verb %q accepted", a.Verb)
				}
			}
		}
	})
}

func TestScriptPerActionDeadline(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	acts, err := ParseScript(strings.NewReader("wait 5\nwait 2000\nwait 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	bad, err := RunScript(ctx5(t), a, acts, &out, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var rs []Result
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r Result
		json.Unmarshal([]byte(l), &r)
		rs = append(rs, r)
	}
	if bad != 2 || len(rs) != 3 || !rs[0].OK || rs[1].Code != "action_deadline" || !rs[2].Skipped {
		t.Fatalf("a wait past the per-action deadline: bad %d\n%s", bad, out.String())
	}
}

// failWriter fails every write, as a closed stdout does.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("stdout closed") }

func TestScriptStopsWhenOutputFails(t *testing.T) {
	f := newFakeQMP(t)
	a := openFake(t, f, nil)
	setFakeFrame(640, 480, color.RGBA{7, 7, 7, 255})
	acts, err := ParseScript(strings.NewReader("capture\nclick 5 5\ntype abc\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RunScript(ctx5(t), a, acts, failWriter{}, 0); err == nil {
		t.Fatal("a failed write to the output was not reported")
	}
	if got := sentInputs(t, f); len(got) != 0 {
		t.Fatalf("actions ran after their output failed: %v", got)
	}
}
