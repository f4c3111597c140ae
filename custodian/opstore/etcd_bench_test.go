package opstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tetherdev/tether/fixtures/etcdtest"
)

// BenchmarkIntegrationDispatchEtcdVsBbolt times one keyed dispatch record
// (Begin + Finish) on the etcd store (3 members on loopback, fsync on
// each) and on the bbolt store, interleaved call by call in the same run
// so machine load hits both alike. It reports both and their ratio.
func BenchmarkIntegrationDispatchEtcdVsBbolt(b *testing.B) {
	c := etcdtest.Start(b, etcdtest.Options{})
	cli := c.Client(b)
	ctx := context.Background()
	es, err := OpenEtcd(ctx, EtcdOptions{Client: cli, Prefix: "/bench/", Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer es.Close()
	if _, err := es.Claim(ctx, "sess-1"); err != nil {
		b.Fatal(err)
	}
	bs, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer bs.Close()
	var etcdT, boltT time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		boltT += timeDispatch(b, bs, fmt.Sprintf("b%d", i))
		etcdT += timeDispatch(b, es, fmt.Sprintf("e%d", i))
	}
	n := float64(b.N)
	b.ReportMetric(float64(boltT.Nanoseconds())/n, "bbolt-ns/dispatch")
	b.ReportMetric(float64(etcdT.Nanoseconds())/n, "etcd-ns/dispatch")
	b.ReportMetric(float64(etcdT)/float64(boltT), "etcd/bbolt")
}

func timeDispatch(b *testing.B, k Keys, key string) time.Duration {
	start := time.Now()
	tk, _, err := k.Begin(context.Background(), intent(key, "r"))
	if err != nil {
		b.Fatal(err)
	}
	if err := tk.Finish(&Receipt{Outcome: Verified, Response: []byte(`{}`)}); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}
