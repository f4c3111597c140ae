package guestrun

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// report writes a complete, valid report of two steps, the first with
// output longer than one chunk.
func report(t testing.TB, out []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := NewWriter(&b)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.Write(Frame{Kind: KindHello, Release: "6.12.95+deb12-amd64", Steps: 2}))
	must(w.Write(Frame{Kind: KindStart, Step: 0}))
	must(w.Output(0, out))
	must(w.Write(Frame{Kind: KindExit, Step: 0, Exit: &Exit{Code: 0, ElapsedS: 1.5}}))
	must(w.Write(Frame{Kind: KindStart, Step: 1}))
	must(w.Write(Frame{Kind: KindExit, Step: 1, Exit: &Exit{Code: -1, Signal: "SIGKILL", TimedOut: true}}))
	must(w.Write(Frame{Kind: KindDone}))
	return b.Bytes()
}

func TestReportRoundTrip(t *testing.T) {
	out := bytes.Repeat([]byte("line \x16 with a marker and \xff invalid UTF-8\n"), 2*MaxChunk/40)
	data := report(t, out)
	if n := bytes.Count(data, []byte(`"kind":"output"`)); n < 2 {
		t.Fatalf("%d output frames: output longer than MaxChunk must be split", n)
	}
	tr, err := Decode(bytes.NewReader(data), 2)
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Hello || !tr.Done || tr.Release != "6.12.95+deb12-amd64" {
		t.Fatalf("transcript %+v", tr)
	}
	if !bytes.Equal(tr.Steps[0].Output, out) {
		t.Fatal("step 0 output changed on the way (bytes must arrive exactly, whatever they are)")
	}
	if !tr.Steps[0].Exit.OK() || tr.Steps[1].Exit.OK() || !tr.Steps[1].Exit.TimedOut {
		t.Fatalf("exits %+v %+v", tr.Steps[0].Exit, tr.Steps[1].Exit)
	}
	if tr.Steps[0].Start.IsZero() || tr.Steps[0].End.Before(tr.Steps[0].Start) {
		t.Fatalf("step times %v %v", tr.Steps[0].Start, tr.Steps[0].End)
	}
}

// A report that stops (the guest crashed, or stopped mid-frame) is not a
// decoding error, but it is not Done either.
func TestReportCutOff(t *testing.T) {
	data := report(t, []byte("x\n"))
	for _, cut := range []int{0, 10, len(data) / 2, len(data) - 2} {
		tr, err := Decode(bytes.NewReader(data[:cut]), 2)
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if tr.Done {
			t.Fatalf("cut at %d: Done", cut)
		}
	}
}

func TestDecodeRefusesOutOfOrder(t *testing.T) {
	hello := `{"kind":"hello","step":0,"time":"2026-01-01T00:00:00Z","release":"r","steps":2}`
	start := func(i string) string { return `{"kind":"start","step":` + i + `,"time":"2026-01-01T00:00:00Z"}` }
	exit := func(i string) string {
		return `{"kind":"exit","step":` + i + `,"time":"2026-01-01T00:00:00Z","exit":{"code":0,"elapsed_s":1}}`
	}
	out := func(i string) string {
		return `{"kind":"output","step":` + i + `,"time":"2026-01-01T00:00:00Z","data":"eA=="}`
	}
	done := `{"kind":"done","step":0,"time":"2026-01-01T00:00:00Z"}`
	for name, lines := range map[string][]string{
		"no hello first":       {start("0")},
		"second hello":         {hello, hello},
		"skips a step":         {hello, start("1")},
		"start while running":  {hello, start("0"), start("1")},
		"output before start":  {hello, out("0")},
		"output of other step": {hello, start("0"), out("1")},
		"exit of other step":   {hello, start("0"), exit("1")},
		"exit without exit":    {hello, start("0"), `{"kind":"exit","step":0,"time":"2026-01-01T00:00:00Z"}`},
		"done early":           {hello, start("0"), exit("0"), done},
		"after done":           {hello, start("0"), exit("0"), start("1"), exit("1"), done, out("1")},
		"restart a step":       {hello, start("0"), exit("0"), start("0")},
		"too many steps":       {hello, start("0"), exit("0"), start("1"), exit("1"), start("2")},
		"unknown kind":         {hello, `{"kind":"pass","step":0,"time":"2026-01-01T00:00:00Z"}`},
		"unknown field":        {`{"kind":"hello","step":0,"time":"2026-01-01T00:00:00Z","release":"r","steps":2,"verdict":"pass"}`},
		"duplicate key":        {`{"kind":"hello","kind":"hello","step":0,"time":"2026-01-01T00:00:00Z","release":"r","steps":2}`},
		"step count differs":   {`{"kind":"hello","step":0,"time":"2026-01-01T00:00:00Z","release":"r","steps":3}`},
		"no release":           {`{"kind":"hello","step":0,"time":"2026-01-01T00:00:00Z","steps":2}`},
		"not json":             {"=== RUN TestX"},
	} {
		_, err := Decode(strings.NewReader(strings.Join(lines, "\n")+"\n"), 2)
		if !errors.Is(err, ErrStream) {
			t.Errorf("%s: Decode = %v, want ErrStream", name, err)
		}
	}
	long := `{"kind":"hello","step":0,"time":"2026-01-01T00:00:00Z","release":"` + strings.Repeat("x", maxFrameLine) + `","steps":2}` + "\n"
	if _, err := Decode(strings.NewReader(long), 2); !errors.Is(err, ErrStream) || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("oversized frame: Decode = %v, want the frame bound", err)
	}
}

func TestDecodeBoundsStepOutput(t *testing.T) {
	defer func(n int) { stepOutputLimit = n }(stepOutputLimit)
	stepOutputLimit = 4 * MaxChunk
	var b bytes.Buffer
	w := NewWriter(&b)
	w.Write(Frame{Kind: KindHello, Release: "r", Steps: 1})
	w.Write(Frame{Kind: KindStart, Step: 0})
	chunk := make([]byte, MaxChunk)
	for range 5 {
		w.Output(0, chunk)
	}
	if _, err := Decode(&b, 1); !errors.Is(err, ErrStream) || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("Decode = %v, want the output bound", err)
	}
}

func TestExitString(t *testing.T) {
	for e, want := range map[*Exit]string{
		nil:                               "no exit reported",
		{Code: 1, ElapsedS: 2}:            "exit 1 after 2.0s",
		{Code: -1, Signal: "SIGSEGV"}:     "killed by SIGSEGV after 0.0s",
		{Code: -1, TimedOut: true}:        "killed at its timeout after 0.0s",
		{Code: -1, Error: "no such file"}: "not run: no such file",
	} {
		if got := e.String(); got != want {
			t.Errorf("%+v: %q, want %q", e, got, want)
		}
	}
	if !(&Exit{}).OK() || (&Exit{Code: 0, Error: "reading output: x"}).OK() {
		t.Error("OK must hold only for exit 0 without error")
	}
}

// FuzzDecode: any input is decoded or refused without panicking, and a
// transcript never claims Done without every step's exit.
func FuzzDecode(f *testing.F) {
	f.Add(report(f, []byte("=== RUN   TestX\n--- PASS: TestX (0.00s)\n")), 2)
	f.Add([]byte(`{"kind":"hello","step":0,"time":"2026-01-01T00:00:00Z","release":"r","steps":1}`+"\n"), 1)
	f.Fuzz(func(t *testing.T, data []byte, steps int) {
		if steps < 0 || steps > 64 {
			return
		}
		tr, err := Decode(bytes.NewReader(data), steps)
		if err == nil && tr.Done {
			for i, s := range tr.Steps {
				if s.Exit == nil {
					t.Fatalf("done with step %d unfinished", i)
				}
			}
		}
	})
}
