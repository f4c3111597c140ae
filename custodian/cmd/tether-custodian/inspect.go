package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/custodian/internal/durable"
	"github.com/tetherdev/tether/custodian/opstore"
)

// cmdReceiptsShow prints receipts as JSON, one per line, oldest dispatch
// first; with --key, the receipts of that op key exactly as stored (one
// per session that used it: op keys are scoped per binding).
func cmdReceiptsShow(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("receipts show", flag.ContinueOnError)
	state := fs.String("state", "", "custodian state directory (required)")
	key := fs.String("key", "", "print only the receipts of this operation key (one per session that used it)")
	wait := fs.Duration("wait", 10*time.Second, "how long a running custodian on DIR may take to answer")
	usageFor(fs, "receipts show --state DIR [--key K] [--wait D]",
		"Prints receipts as JSON (one per line), oldest dispatch first. Keys dispatched by a\n"+
			"custodian that stopped before recording their result are shown interrupted. While a\n"+
			"custodian runs on DIR it is asked for a snapshot (its requests in flight show as\n"+
			"dispatched, its running commands as pending). No receipt is modified.")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if *state == "" || fs.NArg() != 0 || *wait <= 0 {
		fs.Usage()
		return exitUsage
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), *wait, fmt.Errorf("no answer within --wait %s", *wait))
	defer cancel()
	rs, err := opstore.Snapshot(ctx, filepath.Join(*state, custodian.OpKeysDir))
	if err != nil {
		return fail(stderr, exitRuntime, "receipts show: %v", err)
	}
	found := false
	for _, r := range rs {
		if *key != "" && r.OpKey != *key {
			continue
		}
		found = true
		data, err := r.Marshal()
		if err != nil {
			return fail(stderr, exitRuntime, "receipts show: %v", err)
		}
		fmt.Fprintf(stdout, "%s\n", data)
	}
	if *key != "" && !found {
		return fail(stderr, exitFailed, "receipts show: no receipt for op key %q", *key)
	}
	return exitOK
}

// cmdAuditVerify checks the audit log against its checkpoint and an
// optional older external checkpoint.
func cmdAuditVerify(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
	state := fs.String("state", "", "custodian state directory (required)")
	pubkey := fs.String("pubkey", "", "audit verifier key file, note format (required)")
	ckpt := fs.String("checkpoint", "", "an older signed checkpoint kept elsewhere, to check consistency")
	usageFor(fs, "audit verify --state DIR --pubkey FILE [--checkpoint FILE]",
		"Checks every record against the signed tree (inclusion), detects truncation,\n"+
			"reordering and edited records, and proves the log consistent with an older checkpoint.")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if *state == "" || *pubkey == "" || fs.NArg() != 0 {
		fs.Usage()
		return exitUsage
	}
	vkey, err := credfile.ReadPublic(*pubkey)
	if err != nil {
		return fail(stderr, exitRuntime, "audit verify: %v", err)
	}
	v, err := audit.LoadVerifier(vkey)
	if err != nil {
		return fail(stderr, exitUsage, "audit verify: %v", err)
	}
	var external []byte
	if *ckpt != "" {
		if external, err = os.ReadFile(*ckpt); err != nil {
			return fail(stderr, exitRuntime, "audit verify: %v", err)
		}
	}
	rep, err := audit.Verify(filepath.Join(*state, custodian.AuditDir), v, external)
	if err != nil {
		return fail(stderr, exitFailed, "FAIL: %v", err)
	}
	fmt.Fprintf(stdout, "OK: %d records, %d covered by the signed checkpoint (tree %s)", rep.Records, rep.Signed, rep.TreeHash)
	if rep.ExternalSize >= 0 {
		fmt.Fprintf(stdout, "; consistent with the external checkpoint of %d records", rep.ExternalSize)
	}
	fmt.Fprintln(stdout)
	if rep.Unsigned > 0 {
		fmt.Fprintf(stdout, "warning: %d records after the last checkpoint are not yet signed\n", rep.Unsigned)
	}
	if rep.TornBytes > 0 {
		fmt.Fprintf(stdout, "warning: %d bytes of an interrupted last append\n", rep.TornBytes)
	}
	return exitOK
}

// cmdAuditKeygen writes a new audit signing key (PREFIX.key, 0600) and its
// verifier key (PREFIX.pub, 0644).
func cmdAuditKeygen(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("audit keygen", flag.ContinueOnError)
	name := fs.String("name", "", "key and log name, e.g. tether.example/custodian-1 (required)")
	out := fs.String("out", "", "path prefix: writes PREFIX.key and PREFIX.pub (required)")
	usageFor(fs, "audit keygen --name NAME --out PREFIX",
		"Generates an Ed25519 note key for signing audit checkpoints. Existing files are never overwritten.")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if *name == "" || *out == "" || fs.NArg() != 0 {
		fs.Usage()
		return exitUsage
	}
	skey, vkey, err := audit.GenerateKey(*name)
	if err != nil {
		return fail(stderr, exitUsage, "audit keygen: %v", err)
	}
	if err := writeNew(*out+".key", skey+"\n", 0o600); err != nil {
		return fail(stderr, exitRuntime, "audit keygen: %v", err)
	}
	if err := writeNew(*out+".pub", vkey+"\n", 0o644); err != nil {
		return fail(stderr, exitRuntime, "audit keygen: %v", err)
	}
	fmt.Fprintf(stdout, "wrote %s.key and %s.pub\n", *out, *out)
	return exitOK
}

func writeNew(path, data string, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s exists; refusing to overwrite a key", path)
	}
	if err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(data); err != nil {
		f.Close()
		return err
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		return err
	}
	return durable.SyncDir(filepath.Dir(path))
}
