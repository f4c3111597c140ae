package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/statedir"
	"github.com/tetherdev/tether/qmpinput/token"
	"github.com/tetherdev/tether/qmpinput/view"
)

const tokenUsage = `usage: tether-qmp token <mint|revoke|list> --state DIR [flags]

  mint    --role view|control --ttl D [--label NAME] [--origin URL]
          prints a one-time link (the secret is shown once, stored hashed)
  revoke  --id ID       ends the token's sessions and its hold within a second
  list                  one JSON line per token (no secrets)
`

func cmdToken(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return cli.UsageError(stderr, "tether-qmp token", "no subcommand given")
	}
	if cli.IsHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, tokenUsage)
		return exitOK
	}
	switch args[0] {
	case "mint":
		return tokenMint(args[1:], stdout, stderr)
	case "revoke":
		return tokenRevoke(args[1:], stdout, stderr)
	case "list":
		return tokenList(args[1:], stdout, stderr)
	}
	return cli.UsageError(stderr, "tether-qmp token", "unknown subcommand %q", args[0])
}

// operator names the person running the CLI in the audit log.
func operator() string { return "operator (uid " + strconv.Itoa(os.Getuid()) + ")" }

func openState(p string) (*statedir.Dir, error) {
	if p == "" {
		return nil, errors.New("--state is required")
	}
	return statedir.Open(p)
}

func tokenMint(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("token mint", "token mint --state DIR --role view|control --ttl D [--label NAME] [--origin URL]")
	state := fs.String("state", "", "the view's state directory (required)")
	role := fs.String("role", "", "view or control (required)")
	ttl := fs.Duration("ttl", 0, "how long the token lives, at most 24h (required)")
	label := fs.String("label", "", "who the link is for, shown on the page and in the audit log")
	origin := fs.String("origin", "", "origin for the link (default: the one the running view recorded)")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	dir, err := openState(*state)
	if err != nil {
		return failToken(stdout, err)
	}
	defer dir.Close()
	o := *origin
	if o == "" {
		o = readViewOrigin(dir)
	}
	if o, err = view.ParseOrigin(o); err != nil {
		return failToken(stdout, fmt.Errorf("%w (start tether-qmp view first, or give --origin)", err))
	}
	tok, secret, err := token.Open(dir, nil).Mint(token.Role(*role), *ttl, *label)
	if err != nil {
		return failToken(stdout, err)
	}
	if _, err := auditlog.New(dir, nil).Append(auditlog.Record{Kind: auditlog.KindTokenMint, Actor: operator(),
		Role: string(tok.Role), Token: tok.ID, Scope: tok.Actor(), TTLMillis: ttl.Milliseconds()}); err != nil {
		return failToken(stdout, err)
	}
	return emit(stdout, stderr, map[string]any{"ok": true, "id": tok.ID, "role": tok.Role, "label": tok.Label,
		"expires": tok.Expires, "link": o + "/#t=" + string(secret)})
}

func tokenRevoke(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("token revoke", "token revoke --state DIR --id ID")
	state := fs.String("state", "", "the view's state directory (required)")
	id := fs.String("id", "", "the token id (required)")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	dir, err := openState(*state)
	if err != nil {
		return failToken(stdout, err)
	}
	defer dir.Close()
	tok, err := token.Open(dir, nil).Revoke(*id)
	if err != nil {
		return failToken(stdout, err)
	}
	if _, err := auditlog.New(dir, nil).Append(auditlog.Record{Kind: auditlog.KindTokenRevoke, Actor: operator(),
		Role: string(tok.Role), Token: tok.ID, Scope: tok.Actor()}); err != nil {
		return failToken(stdout, err)
	}
	return emit(stdout, stderr, map[string]any{"ok": true, "id": tok.ID, "revoked": tok.Revoked})
}

func tokenList(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("token list", "token list --state DIR")
	state := fs.String("state", "", "the view's state directory (required)")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	dir, err := openState(*state)
	if err != nil {
		return failToken(stdout, err)
	}
	defer dir.Close()
	ts, err := token.Open(dir, nil).List()
	if err != nil {
		return failToken(stdout, err)
	}
	enc := json.NewEncoder(stdout)
	for _, t := range ts {
		t.SecretSHA256 = ""
		if err := enc.Encode(t); err != nil {
			return exitFailed
		}
	}
	return exitOK
}

var tokenCodes = []struct {
	err  error
	code string
}{
	{token.ErrInvalid, "invalid"}, {token.ErrUnknown, "unknown"}, {token.ErrStore, "store"},
	{statedir.ErrUnsafe, "state_unsafe"}, {view.ErrListen, "origin"}, {auditlog.ErrChain, "audit_chain"},
	{auditlog.ErrRecord, "audit_record"},
}

func failToken(w io.Writer, err error) int {
	code := "error"
	for _, c := range tokenCodes {
		if errors.Is(err, c.err) {
			code = c.code
			break
		}
	}
	json.NewEncoder(w).Encode(map[string]any{"ok": false, "code": code, "error": err.Error()})
	return exitFailed
}
