package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/custodian/internal/durable"
	"github.com/tetherdev/tether/custodian/opstore"
)

// cmdReceiptsShow prints receipts as JSON, one per line, oldest dispatch
// first; with --key, the receipts of that op key exactly as stored (one
// per session that used it: op keys are scoped per binding). With
// --config it reads where `run` with that config keeps them: the etcd op
// store of a fleet, or the config's state directory.
func cmdReceiptsShow(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("receipts show", flag.ContinueOnError)
	state := fs.String("state", "", "custodian state directory (this or --config)")
	cfgPath := fs.String("config", "", "run's config file: its op_store (etcd) or its state_dir is read (this or --state)")
	key := fs.String("key", "", "print only the receipts of this operation key (one per session that used it)")
	wait := fs.Duration("wait", 10*time.Second, "how long a running custodian on DIR, or etcd, may take to answer")
	usageFor(fs, "receipts show (--state DIR | --config FILE) [--key K] [--wait D]",
		"Prints receipts as JSON (one per line), oldest dispatch first. Keys dispatched by a\n"+
			"custodian that stopped before recording their result are shown interrupted. While a\n"+
			"custodian runs on DIR it is asked for a snapshot (its requests in flight show as\n"+
			"dispatched, its running commands as pending). With --config FILE whose op_store is\n"+
			"etcd, the fleet's receipts are read from etcd as stored (a key dispatched or pending\n"+
			"there is in flight at its owner, or interrupted at the session's next claim); with\n"+
			"another op_store, FILE's state_dir is read. No receipt is modified.")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if (*state == "") == (*cfgPath == "") || fs.NArg() != 0 || *wait <= 0 {
		fs.Usage()
		return exitUsage
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), *wait, fmt.Errorf("no answer within --wait %s", *wait))
	defer cancel()
	rs, code, err := readReceipts(ctx, *state, *cfgPath)
	if err != nil {
		return fail(stderr, code, "receipts show: %v", err)
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
		for _, r := range rs {
			if r.OpKey == *key+":create" || r.OpKey == *key+":read" || r.OpKey == *key+":write" {
				return fail(stderr, exitFailed, "receipts show: no receipt for op key %q; the plugin keys each step of "+
					"a tool call as KEY:STEP: --key %s, for one", *key, r.OpKey)
			}
		}
		return fail(stderr, exitFailed, "receipts show: no receipt for op key %q", *key)
	}
	return exitOK
}

// readReceipts reads the receipts of state dir state, or of what config
// file cfgPath names (its etcd op store, or its state_dir); on error it
// also returns the exit code.
func readReceipts(ctx context.Context, state, cfgPath string) ([]*opstore.Receipt, int, error) {
	if cfgPath != "" {
		cfg, err := custodian.LoadConfig(cfgPath)
		if err != nil {
			return nil, exitUsage, err
		}
		if cfg.OpStore.Etcd() {
			rs, err := custodian.FleetReceipts(ctx, *cfg.OpStore)
			if errors.Is(err, custodian.ErrConfig) {
				return nil, exitUsage, err
			}
			return rs, exitRuntime, err
		}
		state = cfg.StateDir
	}
	rs, err := opstore.Snapshot(ctx, filepath.Join(state, custodian.OpKeysDir))
	return rs, exitRuntime, err
}

// cmdAuditVerify checks the audit log against its checkpoint and an
// optional older external checkpoint.
func cmdAuditVerify(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
	state := fs.String("state", "", "custodian state directory (required)")
	pubkey := fs.String("pubkey", "", "audit verifier key file, note format (required)")
	ckpt := fs.String("checkpoint", "", "an older signed checkpoint kept elsewhere, to check consistency")
	var witnesses multiFlag
	fs.Var(&witnesses, "witness", "a witness's cosignature verifier key, or a file holding it (repeatable)")
	quorum := fs.Int("witness-quorum", 0, "cosignatures required of the --witness keys (default: all of them)")
	usageFor(fs, "audit verify --state DIR --pubkey FILE [--checkpoint FILE] [--witness KEY... [--witness-quorum K]]",
		"Checks every record against the signed tree (inclusion), detects truncation,\n"+
			"reordering and edited records, and proves the log consistent with an older checkpoint.\n"+
			"With --witness, the log must also match its cosigned checkpoint, cosigned by K of the\n"+
			"witnesses: a log rewritten or truncated and re-signed after it was witnessed fails.")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if *state == "" || *pubkey == "" || fs.NArg() != 0 || *quorum < 0 || *quorum > len(witnesses) {
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
	if len(witnesses) > 0 {
		if code := verifyWitnessed(filepath.Join(*state, custodian.AuditDir), v, witnesses, *quorum, stdout, stderr); code != exitOK {
			return code
		}
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

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return fmt.Sprint([]string(*m)) }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// witnessKeys parses --witness values: a key, or a file holding one.
func witnessKeys(vals []string) ([]note.Verifier, error) {
	out := make([]note.Verifier, 0, len(vals))
	for _, val := range vals {
		if !strings.Contains(val, "+") {
			data, err := credfile.ReadPublic(val)
			if err != nil {
				return nil, err
			}
			val = string(data)
		}
		v, err := audit.LoadWitnessKey(val)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// verifyWitnessed checks the log against its cosigned checkpoint.
func verifyWitnessed(dir string, v note.Verifier, vals []string, quorum int, stdout, stderr io.Writer) int {
	ws, err := witnessKeys(vals)
	if err != nil {
		return fail(stderr, exitUsage, "audit verify: %v", err)
	}
	if quorum == 0 {
		quorum = len(ws)
	}
	n, err := audit.CheckWitnessed(dir, v, ws, quorum)
	if err != nil {
		return fail(stderr, exitFailed, "FAIL: %v", err)
	}
	fmt.Fprintf(stdout, "OK: the first %d records match the checkpoint %d of %d witnesses were required to cosign\n", n, quorum, len(ws))
	return exitOK
}

// cmdAuditWitness sends the log's checkpoint to witnesses and keeps their
// cosignatures (STATE/audit/checkpoint.cosigned).
func cmdAuditWitness(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("audit witness", flag.ContinueOnError)
	state := fs.String("state", "", "custodian state directory (required)")
	pubkey := fs.String("pubkey", "", "audit verifier key file, note format (required)")
	var ws multiFlag
	fs.Var(&ws, "witness", "URL=KEY: a witness's base URL and its cosignature verifier key (repeatable)")
	quorum := fs.Int("quorum", 0, "cosignatures required before the cosigned checkpoint is written (default: all)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on the whole exchange")
	usageFor(fs, "audit witness --state DIR --pubkey FILE --witness URL=KEY... [--quorum K]",
		"Sends the log's current checkpoint to each witness (C2SP tlog-witness, with a consistency\n"+
			"proof from the size the witness saw last) and writes the cosigned checkpoint.")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if *state == "" || *pubkey == "" || len(ws) == 0 || fs.NArg() != 0 || *quorum < 0 || *quorum > len(ws) {
		fs.Usage()
		return exitUsage
	}
	vkey, err := credfile.ReadPublic(*pubkey)
	if err != nil {
		return fail(stderr, exitRuntime, "audit witness: %v", err)
	}
	v, err := audit.LoadVerifier(vkey)
	if err != nil {
		return fail(stderr, exitUsage, "audit witness: %v", err)
	}
	witnesses := make([]audit.Witness, 0, len(ws))
	for _, w := range ws {
		u, key, ok := strings.Cut(w, "=")
		wv, err := audit.LoadWitnessKey(key)
		if !ok || err != nil {
			return fail(stderr, exitUsage, "audit witness: --witness %q: want URL=KEY: %v", w, err)
		}
		witnesses = append(witnesses, audit.Witness{URL: u, Verifier: wv})
	}
	if *quorum == 0 {
		*quorum = len(witnesses)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	names, err := audit.Cosign(ctx, filepath.Join(*state, custodian.AuditDir), v, witnesses, *quorum, nil)
	if err != nil {
		return fail(stderr, exitFailed, "FAIL: %v", err)
	}
	fmt.Fprintf(stdout, "OK: cosigned by %s\n", strings.Join(names, ", "))
	return exitOK
}
