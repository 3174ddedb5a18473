package faults

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The single node's disk faults. Its data directory is a small tmpfs of its own, so that the
// nemesis can fill it (fill-disk: a file takes every free byte for a while, then is removed)
// without touching the machine's disk; a tmpfs outlives a SIGKILL of the process like a disk
// does. The node runs with small log segments (singleSegmentBytes), so snapshots and compaction
// run every few hundred writes, and kill-node-in-snapshot kills it while a snapshot is being
// written (a snap-*.tmp file exists).

const (
	singleDiskSize     = "64m"
	singleSegmentBytes = 32 << 10
)

// mountDataDisk mounts a tmpfs at dir.
func mountDataDisk(dir string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the single topology mounts a tmpfs for its full-disk fault: run as root")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+singleDiskSize, "tmpfs", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount a tmpfs at %s: %v: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func unmountDataDisk(dir string) {
	_ = exec.Command("umount", "-l", dir).Run()
}

// fillDisk takes every free byte of the file system holding dir with one file and returns a
// function that removes it.
func fillDisk(dir string) (func() error, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return nil, err
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// fallocate may leave a few blocks (the file's own metadata): appending until ENOSPC takes them.
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, free); err != nil && err != syscall.ENOSPC {
		os.Remove(path)
		return nil, fmt.Errorf("fallocate %d bytes: %w", free, err)
	}
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			break
		}
	}
	return func() error { return os.Remove(path) }, nil
}

// waitForSnapshot waits up to limit for a snapshot being written in dir (a snap-*.tmp file) and
// returns its name, "" if none started. Polled every millisecond: a snapshot here takes a few.
func waitForSnapshot(dir string, limit time.Duration) string {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if m, _ := filepath.Glob(filepath.Join(dir, "snap-*.tmp")); len(m) > 0 {
			return filepath.Base(m[0])
		}
		time.Sleep(time.Millisecond)
	}
	return ""
}
