package opstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// BenchmarkDispatchRecord is the hot path: Begin (one fdatasync) + Finish
// (write-behind). Compare with the two baselines in the same run.
func BenchmarkDispatchRecord(b *testing.B) {
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	syncs := countSyncs(b)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		tk, _, err := s.Begin(ctx, intent(fmt.Sprintf("b%d", i), "r"))
		if err != nil {
			b.Fatal(err)
		}
		if err := tk.Finish(&Receipt{Outcome: Verified, Response: []byte(`{}`)}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(syncs.Load())/float64(b.N), "fdatasyncs/op")
}

// BenchmarkDispatchRecordParallel shows group commit: concurrent
// dispatches share fdatasyncs.
func BenchmarkDispatchRecordParallel(b *testing.B) {
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var n atomic.Int64
	syncs := countSyncs(b)
	b.ResetTimer()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tk, _, err := s.Begin(ctx, intent(fmt.Sprintf("p%d", n.Add(1)), "r"))
			if err != nil {
				b.Error(err)
				return
			}
			tk.Finish(&Receipt{Outcome: Verified, Response: []byte(`{}`)})
		}
	})
	b.ReportMetric(float64(syncs.Load())/float64(b.N), "fdatasyncs/op")
}

// countSyncs counts the intent log's fdatasyncs until b ends.
func countSyncs(b *testing.B) *atomic.Int64 {
	var syncs atomic.Int64
	orig := fdatasync
	fdatasync = func(fd int) error { syncs.Add(1); return orig(fd) }
	b.Cleanup(func() { fdatasync = orig })
	return &syncs
}

// BenchmarkBaselineAppendFdatasync is the floor: one 300-byte append and
// one fdatasync.
func BenchmarkBaselineAppendFdatasync(b *testing.B) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rec := make([]byte, 300)
	for b.Loop() {
		f.Write(rec)
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBaselineBoltUpdate is the alternative the issue names: one
// bbolt commit per dispatch (two fsyncs).
func BenchmarkBaselineBoltUpdate(b *testing.B) {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "b.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	rec := make([]byte, 300)
	for i := 0; b.Loop(); i++ {
		err := db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte("k"))
			if err != nil {
				return err
			}
			return bk.Put([]byte(fmt.Sprint(i)), rec)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
