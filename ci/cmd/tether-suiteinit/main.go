// Command tether-suiteinit is PID 1 of a CI test guest: it runs the suite
// plan the host placed in the image, streams the report over a
// virtio-serial port and powers the guest off (ci/guestrun).
//
//	tether-suiteinit          as PID 1 only
//	tether-suiteinit --help   this text
package main

import (
	"fmt"
	"os"

	"github.com/tetherdev/tether/ci/guestrun"
)

const usage = `usage: tether-suiteinit
Runs as PID 1 of a CI test guest: mounts the pseudo file systems, loads the
kernel modules in ` + guestrun.ModuleList + `, runs the steps of
` + guestrun.PlanPath + ` and reports them on the plan's virtio-serial
port, then powers the guest off. It refuses to run as any other PID.
`

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-help" || args[0] == "-h") {
		fmt.Print(usage)
		return 0
	}
	if len(args) != 0 || os.Getpid() != 1 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	guestrun.Main()
	return 0
}
