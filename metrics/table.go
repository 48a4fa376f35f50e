package metrics

import "github.com/prometheus/client_golang/prometheus"

// namespace prefixes every metric name.
const namespace = "blk"

// field is one metric read from a stats struct S: its name (without the
// blk_ prefix), help, type and how to read it.
type field[S any] struct {
	name, help string
	typ        prometheus.ValueType
	val        func(*S) float64
}

func counter[S any](name, help string, val func(*S) uint64) field[S] {
	return field[S]{name: name, help: help, typ: prometheus.CounterValue,
		val: func(s *S) float64 { return float64(val(s)) }}
}

// fcounter is a counter kept as a float (seconds).
func fcounter[S any](name, help string, val func(*S) float64) field[S] {
	return field[S]{name: name, help: help, typ: prometheus.CounterValue, val: val}
}

func gauge[S any](name, help string, val func(*S) float64) field[S] {
	return field[S]{name: name, help: help, typ: prometheus.GaugeValue, val: val}
}

// table is a set of metrics read from the same stats struct, each with
// the same constant and variable labels.
type table[S any] struct {
	descs  []*prometheus.Desc
	fields []field[S]
}

func newTable[S any](constLabels prometheus.Labels, varLabels []string, fields ...field[S]) table[S] {
	t := table[S]{fields: fields}
	for _, f := range fields {
		t.descs = append(t.descs, prometheus.NewDesc(namespace+"_"+f.name, f.help, varLabels, constLabels))
	}
	return t
}

func (t *table[S]) describe(ch chan<- *prometheus.Desc) {
	for _, d := range t.descs {
		ch <- d
	}
}

// collect sends every metric of the table for s, with the variable label
// values lv (in the order newTable was given the names).
func (t *table[S]) collect(ch chan<- prometheus.Metric, s *S, lv ...string) {
	for i, f := range t.fields {
		ch <- prometheus.MustNewConstMetric(t.descs[i], f.typ, f.val(s), lv...)
	}
}
