package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/blk-project/blk/api"
	"github.com/urfave/cli/v2"
)

// Persistent reservations (docs/reservations.md §6): what the registry
// keeps of a volume's NVMe reservation, and the operator's clear.

// reservationCommand is `blkctl volume reservation show|clear`.
func reservationCommand() *cli.Command {
	return &cli.Command{
		Name:  "reservation",
		Usage: "show or clear a volume's NVMe persistent reservation (the hosts' registrations and the holder, kept by the registry)",
		Subcommands: []*cli.Command{
			{
				Name: "show", Usage: "show the reservation: generation, type, holder, registrants (host ID, NQN, key), Persist Through Power Loss", UsageText: "blkctl volume reservation show VOLUME",
				Action: reservationShow,
			},
			{
				Name: "clear", Usage: "break glass: drop every registration and the reservation (the hosts are told their reservation was preempted); for a host that is gone for good holding it", UsageText: "blkctl volume reservation clear VOLUME --yes",
				Flags:  []cli.Flag{&cli.BoolFlag{Name: "yes", Usage: "clear it: without --yes nothing is done"}},
				Action: reservationClear,
			},
		},
	}
}

func reservationShow(c *cli.Context) error {
	a, err := args(c, "volume")
	if err != nil {
		return err
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var v volume
	if err := e.api.do("GET", volPath(a[0]), nil, &v); err != nil {
		return hint(err, a[0], "")
	}
	if v.Reservation == nil {
		return fmt.Errorf("blkd at %s shows no reservation for volume %s: upgrade every node to a blkd that serves reservations", e.api.base, a[0])
	}
	if e.json {
		return e.printJSON(v.Reservation)
	}
	return e.showReservation(*v.Reservation)
}

func reservationClear(c *cli.Context) error {
	a, err := args(c, "volume")
	if err != nil {
		return err
	}
	if !c.Bool("yes") {
		return usageErrorf("%s: this drops every host's registration and the reservation of volume %s, which a cluster of hosts relies on to fence its members: repeat with --yes to do it", c.Command.FullName(), a[0])
	}
	e, err := newEnv(c)
	if err != nil {
		return err
	}
	var ans api.ClearReservationAnswer
	if err := e.api.do("POST", volPath(a[0])+"/reservation/clear", nil, &ans); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.notFoundRoute() {
			return fmt.Errorf("this blkd (%s) has no reservations: upgrade every node", e.api.base)
		}
		return hint(err, a[0], "")
	}
	if e.json {
		return e.printJSON(ans.Reservation)
	}
	fmt.Fprintf(e.stdout, "cleared the reservation of volume %s (generation %d)\n", a[0], ans.Reservation.Gen)
	return nil
}

// showReservation prints r as key, value rows and a table of registrants.
func (e *env) showReservation(r api.Reservation) error {
	holder := "-"
	if r.Holder != "" {
		holder = r.Holder
		if r.HolderNQN != "" {
			holder += " (" + r.HolderNQN + ")"
		}
	} else if strings.HasSuffix(r.Type, "all-registrants") {
		holder = "every registrant"
	}
	if err := e.keyValues([][2]string{
		{"Generation", fmt.Sprint(r.Gen)},
		{"Type", r.Type},
		{"Holder", holder},
		{"PTPL", onOff(r.PTPL)},
		{"Registrants", fmt.Sprint(len(r.Registrants))},
	}); err != nil {
		return err
	}
	if len(r.Registrants) == 0 {
		return nil
	}
	fmt.Fprintln(e.stdout)
	tw := e.table()
	fmt.Fprintln(tw, "HOST ID\tHOST NQN\tKEY\tHOLDS")
	for _, g := range r.Registrants {
		nqn := g.HostNQN
		if nqn == "" {
			nqn = "-"
		}
		holds := ""
		if g.Holder {
			holds = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%#x\t%s\n", g.HostID, nqn, g.Key, holds)
	}
	return tw.Flush()
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// reservationRow is volume show's one line of the reservation, "" if
// the volume has none to show.
func reservationRow(v volume) string {
	r := v.Reservation
	if r == nil || r.Gen == 0 && len(r.Registrants) == 0 {
		return ""
	}
	s := fmt.Sprintf("%s, generation %d, %d registrant(s)", r.Type, r.Gen, len(r.Registrants))
	if r.Holder != "" {
		s += ", held by " + r.Holder
	}
	return s
}
