package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strings"
	"testing"

	"github.com/tetherdev/tether/computer/api"
)

// exportBackend exports a fixed stream under the receipt it is given.
type exportBackend struct {
	api.Backend
	body    string
	receipt api.Receipt
}

func (b exportBackend) Export(_ context.Context, c api.Caller, id string) (io.ReadCloser, api.Receipt, error) {
	return io.NopCloser(strings.NewReader(b.body)), b.receipt, nil
}

// TestExportChecksTheAnnouncedDigest is the attack test of the client's
// digest check: a stream whose bytes are not those the daemon's header
// names is an error. Positive control: the honest answer passes and the
// bytes arrive.
func TestExportChecksTheAnnouncedDigest(t *testing.T) {
	body := "tar.zst bytes"
	s := sha256.Sum256([]byte(body))
	honest := api.Receipt{Computer: "c1", Op: api.OpExport, SHA256: hex.EncodeToString(s[:]), Bytes: int64(len(body))}
	c, _ := newTLSClient(t, exportBackend{body: body, receipt: honest})
	var buf bytes.Buffer
	st, err := c.Export(context.Background(), "c1", &buf)
	if err != nil || buf.String() != body || st.SHA256 != honest.SHA256 {
		t.Fatalf("positive control: export %+v %q %v", st, buf.String(), err)
	}
	lying := honest
	lying.SHA256 = strings.Repeat("0", 64)
	c, _ = newTLSClient(t, exportBackend{body: body, receipt: lying})
	if _, err := c.Export(context.Background(), "c1", io.Discard); err == nil || !strings.Contains(err.Error(), "announced") {
		t.Fatalf("export under a wrong digest: %v, want a refusal", err)
	}
}
