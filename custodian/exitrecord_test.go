package custodian

import (
	"encoding/json"
	"testing"

	"github.com/tetherdev/tether/custodian/opstore"
	"github.com/tetherdev/tether/receiver/wire"
)

// TestReceiptExitKeepsTheWireShape: the receipt's exit type marshals byte
// for byte as the receiver's exit status did when receipts stored it, and
// a stored exit decodes into it and back unchanged, so receipts written
// before the receipt had its own type replay as they were.
func TestReceiptExitKeepsTheWireShape(t *testing.T) {
	zero, three := 0, 3
	for _, w := range []wire.ExitStatus{{}, {ExitCode: &zero}, {ExitCode: &three}, {Signal: "KILL"}} {
		want, err := json.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		r := receiptExit(w)
		got, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("receipt exit %s, wire exit %s", got, want)
		}
		var stored opstore.ExitStatus
		if err := json.Unmarshal(want, &stored); err != nil {
			t.Fatalf("decode stored %s: %v", want, err)
		}
		back, err := json.Marshal(wireExit(&stored))
		if err != nil {
			t.Fatal(err)
		}
		if string(back) != string(want) {
			t.Errorf("stored %s replays as %s", want, back)
		}
	}
	if wireExit(nil) != nil {
		t.Error("wireExit(nil) is not nil")
	}
}
