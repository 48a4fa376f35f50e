package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/blk-project/blk/api"
	"github.com/urfave/cli/v2"
)

// hostListCommand is `blkctl host list`: the registered hosts
// (docs/operations.md §1.9), which the CSI node plugin registers with
// its Kubernetes node name and zone. A registration grants nothing:
// host allow does.
func hostListCommand() *cli.Command {
	return &cli.Command{
		Name: "list", Usage: "list the registered hosts (the CSI node plugin registers each Kubernetes node; registering grants no volume)",
		UsageText: "blkctl host list",
		Action:    hostList,
	}
}

func hostList(c *cli.Context) error {
	if _, err := args(c); err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var l api.HostList
	err = e.api.do("GET", "/v1/hosts", nil, &l)
	var ae *apiError
	if errors.As(err, &ae) && ae.notFoundRoute() {
		return fmt.Errorf("this blkd (%s) has no host registry: upgrade every node to a blkd with GET /v1/hosts", e.api.base)
	}
	if err != nil {
		return err
	}
	if l.Hosts == nil {
		l.Hosts = []api.Host{}
	}
	if e.json {
		return e.printJSON(l)
	}
	if len(l.Hosts) == 0 {
		fmt.Fprintln(e.stdout, "no registered hosts (the CSI node plugin registers each node it runs on; POST /v1/hosts)")
		return nil
	}
	tw := e.table()
	fmt.Fprintln(tw, "HOSTNQN\tNAME\tZONE\tREGISTERED")
	for _, h := range l.Hosts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.HostNQN, dash(h.Name), dash(h.Zone), h.RegisteredAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}
