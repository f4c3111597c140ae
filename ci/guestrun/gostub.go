package guestrun

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// GoStubName is the argv[0] base name under which the suite init acts as
// the guest's stand-in for the Go toolchain.
const GoStubName = "go"

// ErrNoToolchain is wrapped when the stand-in is asked for anything but
// the one build it can answer.
var ErrNoToolchain = errors.New("the guest has no Go toolchain")

// GoStub answers exactly one request, `go build -trimpath -o OUT .` with
// CGO_ENABLED=0, in a directory the plan lists in Stubs, by copying the
// binary the host built from that directory with the same flags. Tests
// that build the binary under test (receiver/cmd/tether-receiver) then run
// that prebuilt binary, whose SHA-256 the receipt lists. Every other
// request fails with ErrNoToolchain: nothing is compiled in the guest.
func GoStub(args []string, plan Plan, dir string) error {
	if !slices.Equal(args, []string{"build", "-trimpath", "-o", argAt(args, 3), "."}) || argAt(args, 3) == "" {
		return fmt.Errorf("%w: only `go build -trimpath -o OUT .` is served, not go %q", ErrNoToolchain, args)
	}
	if os.Getenv("CGO_ENABLED") != "0" {
		return fmt.Errorf("%w: the prebuilt binaries are CGO_ENABLED=0; this request has CGO_ENABLED=%q",
			ErrNoToolchain, os.Getenv("CGO_ENABLED"))
	}
	for _, s := range plan.Stubs {
		if s.Dir == dir {
			return copyFile(s.Binary, args[3])
		}
	}
	return fmt.Errorf("%w: no prebuilt binary for %s", ErrNoToolchain, dir)
}

func argAt(args []string, i int) string {
	if i < len(args) {
		return args[i]
	}
	return ""
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// GoStubMain runs GoStub with the process's arguments, the plan at
// PlanPath and the working directory, and exits: 0 on success, 2 with the
// reason on stderr otherwise.
func GoStubMain() {
	err := func() error {
		data, err := os.ReadFile(PlanPath)
		if err != nil {
			return err
		}
		plan, err := DecodePlan(data)
		if err != nil {
			return err
		}
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		return GoStub(os.Args[1:], plan, wd)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "go (guest stand-in):", err)
		os.Exit(2)
	}
	os.Exit(0)
}
