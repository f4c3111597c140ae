package vm

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/fixtures/bins"
	"github.com/tetherdev/tether/fixtures/computer"
	"github.com/tetherdev/tether/fixtures/e2e"
)

// TestIntegrationVMSvcPipeline runs the chain's end-to-end pipeline
// (fixtures/e2e.RunPipeline: host agent, plugin, custodian, receiver; the
// suite TestIntegrationRootNativePipeline runs against a namespaced
// computer) against VM computers the service makes: each subtest has its
// own computer, created with tier vm, reached through the custodian
// configuration the service handed out, and deleted through the service
// after. The computers start from a saved state (serve --vm-state), so
// fifteen creates cost fifteen restores; TestIntegrationVMSvcAttacks
// covers the other mode, a cold boot of the guest image.
func TestIntegrationVMSvcPipeline(t *testing.T) {
	h := newSvcHarness(t, svcSavedState)
	e2e.RunPipeline(t, h.factory)
}

// factory is the e2e.Factory of VM computers made through the service.
// Of the options only Lease means something here (the first grant ends
// that long from now, as computer.New makes it); any other is refused.
func (h *svcHarness) factory(t *testing.T, _ bins.Set, o computer.Options) computer.Computer {
	t.Helper()
	lease := o.Lease
	if o.Lease = 0; !reflect.DeepEqual(o, computer.Options{}) {
		t.Fatalf("options a VM computer made through the service does not take: %+v", o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	c := h.create(t, ctx, api.Limits{})
	t.Logf("VM computer %s through the service in %s", c.c.ID, time.Since(start).Round(time.Millisecond))
	if lease > 0 {
		g := c.Grant()
		g.NotAfter = time.Now().Add(lease).UTC().Truncate(time.Second)
		if _, err := c.Publish(ctx, time.Time{}, g); err != nil {
			t.Fatal(err)
		}
	}
	return c
}
