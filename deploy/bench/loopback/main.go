// Command loopback measures the link a rebuild on one machine uses: one
// TCP connection over 127.0.0.1, written with 1 MiB writes for -bytes,
// read on the other end; it prints MB/s (the receiver's clock). The
// ceiling for deploy/bench/rebuild.sh, beside the disk's.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"
)

func main() {
	total := flag.Int64("bytes", 4<<30, "bytes to send")
	flag.Parse()
	if *total <= 0 {
		log.Fatalf("loopback: -bytes %d: must be positive", *total)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	type result struct {
		d   time.Duration
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		start := time.Now()
		buf := make([]byte, 1<<20)
		for left := *total; left > 0 && err == nil; {
			var n int
			n, err = c.Read(buf[:min(int64(len(buf)), left)])
			left -= int64(n)
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		got <- result{time.Since(start), err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for sent := int64(0); sent < *total; {
		n, err := c.Write(buf[:min(int64(len(buf)), *total-sent)])
		if err != nil {
			log.Fatal(err)
		}
		sent += int64(n)
	}
	r := <-got
	c.Close()
	if r.err != nil {
		log.Fatal(r.err)
	}
	fmt.Fprintf(os.Stdout, "%.1f\n", float64(*total)/1e6/r.d.Seconds())
}
