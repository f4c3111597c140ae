package audit

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkAppendDurable measures audit appends per second including
// fdatasync: b.N Appends from 8 goroutines, then Sync. Compare with
// BenchmarkBaselineSyncEachRecord in the same run.
func BenchmarkAppendDurable(b *testing.B) {
	k := newKeys(b, "tether.test/audit")
	l, err := Open(filepath.Join(b.TempDir(), "audit"), Options{Signer: k.s, Verifier: k.v})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	r := rec(1)
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Append(r); err != nil {
				b.Error(err)
				return
			}
		}
	})
	if err := l.Sync(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}

// BenchmarkBaselineSyncEachRecord writes the same record with one
// fdatasync each: what the log would cost without group commit.
func BenchmarkBaselineSyncEachRecord(b *testing.B) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	r := rec(1)
	data, _ := r.encode()
	data = append(data, '\n')
	for b.Loop() {
		f.Write(data)
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}
