package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/blk-project/blk/api"
	"github.com/urfave/cli/v2"
)

// clusterSummary is cluster status's one-line account of the cluster,
// and its "summary" object under -o json.
type clusterSummary struct {
	Nodes int `json:"nodes"`
	Up    int `json:"up"`
	// Ready counts the members whose readiness is "ready"; nil (absent)
	// when no member's readiness is known (an older blkd answered).
	Ready    *int   `json:"ready,omitempty"`
	Leader   string `json:"leader"` // "" when none is known
	Promised uint64 `json:"promised_bytes"`
	// Capacity is the sum of the members' capacities; Unlimited counts
	// the members with no limit (capacity 0), left out of the sum.
	Capacity  uint64 `json:"capacity_bytes"`
	Unlimited int    `json:"unlimited_nodes,omitempty"`
	// Held and DiskTotal are what the members that answered report of
	// their stores; Unanswered counts the others.
	Held       uint64 `json:"held_bytes"`
	DiskTotal  uint64 `json:"disk_total_bytes"`
	Unanswered int    `json:"unanswered_nodes,omitempty"`
	Volumes    int    `json:"volumes"`
	Degraded   int    `json:"degraded"`
	Failed     int    `json:"failed"`
}

// summarize counts ci's members (sorted by the caller) and vols.
func summarize(ci clusterInfo, vols []api.Volume) clusterSummary {
	s := clusterSummary{Nodes: len(ci.Members), Leader: ci.LeaderID, Volumes: len(vols)}
	for _, m := range ci.Members {
		if m.State == "up" {
			s.Up++
		}
		if m.Ready != "" {
			if s.Ready == nil {
				s.Ready = new(int)
			}
			if m.Ready == api.ReadyYes {
				*s.Ready++
			}
		}
		s.Promised += m.PromisedBytes
		if m.CapacityBytes == 0 && m.State != "unregistered" {
			s.Unlimited++
		}
		s.Capacity += m.CapacityBytes
		if m.Disk == nil {
			s.Unanswered++
			continue
		}
		s.Held += m.Disk.MappedBytes
		s.DiskTotal += m.Disk.TotalBytes
	}
	for _, v := range vols {
		switch {
		case v.State == "failed":
			s.Failed++
		case v.State == "degraded" || strings.HasPrefix(v.Reason, "degraded"):
			s.Degraded++
		}
	}
	return s
}

// String is the summary line: "3 nodes (3 up, 3 ready), leader node1; capacity:
// 8 MiB promised of 300 GiB, 1 GiB held of 900 GiB on disk; 2 volumes
// (0 degraded, 0 failed)".
func (s clusterSummary) String() string {
	leader := s.Leader
	if leader == "" {
		leader = "none known"
	}
	capacity := api.HumanSize(s.Capacity)
	if s.Unlimited > 0 {
		capacity += fmt.Sprintf(" (+%d nodes with no limit)", s.Unlimited)
	}
	disk := api.HumanSize(s.Held) + " held of " + api.HumanSize(s.DiskTotal) + " on disk"
	if s.Unanswered > 0 {
		disk += fmt.Sprintf(" (%d nodes did not answer)", s.Unanswered)
	}
	nodes := fmt.Sprintf("%d up", s.Up)
	if s.Ready != nil {
		nodes += fmt.Sprintf(", %d ready", *s.Ready)
	}
	return fmt.Sprintf("%d nodes (%s), leader %s; capacity: %s promised of %s, %s; %d volumes (%d degraded, %d failed)",
		s.Nodes, nodes, leader, api.HumanSize(s.Promised), capacity, disk, s.Volumes, s.Degraded, s.Failed)
}

func clusterStatus(c *cli.Context) error {
	if _, err := args(c); err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var ci clusterInfo
	if err := e.api.do("GET", "/v1/cluster?usage=true&health=true", nil, &ci); err != nil {
		return err
	}
	var vl api.VolumeList
	if err := e.api.do("GET", "/v1/volumes", nil, &vl); err != nil {
		return err
	}
	sort.Slice(ci.Members, func(i, j int) bool { return ci.Members[i].ID < ci.Members[j].ID })
	sum := summarize(ci, vl.Volumes)
	if e.json {
		return e.printJSON(struct {
			clusterInfo
			Summary clusterSummary `json:"summary"`
		}{ci, sum})
	}
	leader := ci.LeaderID
	if leader == "" {
		leader = "(none known)"
	} else if ci.LeaderAPI != "" {
		leader += " (api " + ci.LeaderAPI + ")"
	}
	fmt.Fprintf(e.stdout, "answered by: %s\nleader:      %s\nsummary:     %s\n\n", ci.NodeID, leader, sum)
	tw := e.table()
	fmt.Fprintln(tw, "NODE\tLEADER\tSTATE\tREADY\tZONE\tSUFFRAGE\tRAFT\tAPI\tNVME/TCP\tNVME/RDMA\tPROMISED\tDISK")
	for _, m := range ci.Members {
		l := ""
		if m.Leader {
			l = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, l, m.State, readyCell(m.Ready), dash(m.Zone), m.Suffrage, m.RaftAddr,
			dash(m.APIAddr), dash(m.TCPAddr), dash(m.NVMeAddr), promised(m), disk(m.Disk))
	}
	return tw.Flush()
}

// readyCell is a member's readiness in the READY column: yes, no (the
// failing checks), unreachable, or - when the answering blkd does not
// report readiness.
func readyCell(ready string) string {
	switch {
	case ready == "":
		return "-"
	case ready == api.ReadyYes:
		return "yes"
	case strings.HasPrefix(ready, api.NotReadyPrefix):
		return "no (" + strings.TrimPrefix(ready, api.NotReadyPrefix) + ")"
	case ready == strings.TrimSuffix(api.NotReadyPrefix, ": "):
		return "no"
	}
	return ready
}
