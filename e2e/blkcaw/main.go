// Command blkcaw is the e2e tests' Compare and Write racer: it connects to
// an NVMe-oF subsystem over NVMe/TCP with blk's initiator and, together
// with other instances on other hosts, advances a counter held in one
// block with fused Compare and Write, as ESXi's ATS takes a VMFS lock.
// The block holds (round, owner, checksum) and a filler derived from
// them; each instance reads the block, checks it whole, and asks to
// replace it with (round+1, its owner). If Compare and Write is atomic,
// exactly one instance wins each round. Each instance writes the rounds
// it won, one per line, to -out, and "tries won miscompares" to
// -out.stats; the test merges them.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"strings"
	"time"

	"github.com/blk-project/blk/initiator"
)

func main() {
	addr := flag.String("addr", "", "target NVMe/TCP address host:port")
	nqn := flag.String("nqn", "", "subsystem NQN")
	host := flag.String("hostnqn", "nqn.2026-11.io.blk:blkcaw", "host NQN")
	owner := flag.Uint64("owner", 1, "this instance's owner number (non-zero)")
	rounds := flag.Uint64("rounds", 500, "the counter's final value")
	lba := flag.Uint64("lba", 0, "the block holding the counter")
	init := flag.Bool("init", false, "write round 0 (owner 0) first")
	out := flag.String("out", "", "file for the rounds won")
	flag.Parse()
	if err := run(*addr, *nqn, *host, *owner, *rounds, *lba, *init, *out); err != nil {
		fmt.Fprintf(os.Stderr, "blkcaw: %v\n", err)
		os.Exit(1)
	}
}

// encode fills b (one block) with round, owner, a filler and the
// checksum of everything else in its last 4 bytes.
func encode(b []byte, round, owner uint64) {
	binary.LittleEndian.PutUint64(b, round)
	binary.LittleEndian.PutUint64(b[8:], owner)
	x := round*0x9E3779B97F4A7C15 ^ owner
	for i := 16; i+8 <= len(b)-8; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.ChecksumIEEE(b[:len(b)-4]))
}

// decode checks b whole and returns its round and owner.
func decode(b []byte) (round, owner uint64, err error) {
	if crc32.ChecksumIEEE(b[:len(b)-4]) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return 0, 0, errors.New("torn block: checksum does not match")
	}
	round, owner = binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	want := make([]byte, len(b))
	encode(want, round, owner)
	if string(want) != string(b) {
		return 0, 0, fmt.Errorf("block of round %d owner %d differs from its encoding", round, owner)
	}
	return round, owner, nil
}

func run(addr, nqn, host string, owner, rounds, lba uint64, init bool, out string) error {
	if addr == "" || nqn == "" || owner == 0 || out == "" {
		return errors.New("-addr, -nqn, -out and a non-zero -owner are required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	ctrl, err := initiator.Connect(ctx, initiator.Config{Transport: initiator.TransportTCP, HostNQN: host, Queues: 1, QueueDepth: 8}, addr, nqn)
	cancel()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer ctrl.Close()
	ns := ctrl.Namespace(1)
	if ns == nil {
		return errors.New("namespace 1 missing")
	}
	bs := ns.BlockSize()
	cur, next := make([]byte, bs), make([]byte, bs)
	if init {
		encode(cur, 0, 0)
		if _, err := ns.WriteAt(cur, int64(lba)*int64(bs)); err != nil {
			return fmt.Errorf("writing round 0: %w", err)
		}
	}
	var won []string
	var lost, tries int
	start := time.Now()
	for {
		if _, err := ns.ReadAt(cur, int64(lba)*int64(bs)); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		round, _, err := decode(cur)
		if err != nil {
			return err
		}
		if round >= rounds {
			break
		}
		encode(next, round+1, owner)
		tries++
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = ns.CompareAndWrite(ctx, lba, cur, next, 0)
		cancel()
		switch {
		case err == nil:
			won = append(won, fmt.Sprint(round+1))
		case initiator.IsCompareFailure(err):
			lost++
		default:
			return fmt.Errorf("compare and write of round %d: %w", round+1, err)
		}
	}
	if err := os.WriteFile(out, []byte(strings.Join(won, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	line := fmt.Sprintf("owner %d: %d tries, %d won, %d miscompares in %v\n", owner, tries, len(won), lost, time.Since(start).Round(time.Millisecond))
	fmt.Print(line)
	return os.WriteFile(out+".stats", []byte(fmt.Sprintf("%d %d %d\n", tries, len(won), lost)), 0o644)
}
