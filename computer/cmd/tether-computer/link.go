package main

import (
	"context"
	"io"
	"time"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/computer/api"
)

// runLink is `tether-computer link`: a one-time link to the live view of
// a running computer with a screen, for its owner (or an admin).
func runLink(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, c := newFlags("link", "link [--role view|control] [--ttl DUR] [flags] ID",
		"Mints a one-time link to the live view of a running VM computer made with --screen, and prints it\n"+
			"(JSON: link, role, expires_at). Only the computer's owner (or an admin) gets one. The link is a\n"+
			"secret: the first browser that opens it is the viewer. view watches; control may also take over\n"+
			"the input and hand it back.", stderr)
	role := fs.String("role", api.LinkRoleControl, "view or control")
	ttl := fs.Duration("ttl", api.DefaultLinkTTL, "how long the link may be opened, whole seconds, at most 24h")
	pos, code, done := parse(fs, args, stdout, 1)
	if done {
		return code
	}
	if *ttl < time.Second || *ttl > api.MaxLinkTTL {
		return cli.UsageError(stderr, fs.Name(), "--ttl %v: want 1s to %v", *ttl, api.MaxLinkTTL)
	}
	cl, err := c.client()
	if err != nil {
		return fail(stderr, "link", err)
	}
	l, err := cl.Link(ctx, pos[0], *role, *ttl)
	if err != nil {
		return fail(stderr, "link", err)
	}
	return printJSON(stdout, l)
}
