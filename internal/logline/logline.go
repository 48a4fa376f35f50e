// Package logline reads one line of blkd's log: a record of log/slog's
// text handler (time=… level=INFO msg=ready node=n1) or of its JSON
// handler ({"time":…,"msg":"ready",…}), whichever --log-format chose.
// Tests, the e2e harness and tools that wait for an event ("a line whose
// msg is ready") use it instead of matching text.
//
// What this package must never do: guess. A line that is neither format
// gives no fields.
package logline

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Fields returns the top-level fields of line as strings (a JSON number
// or boolean as JSON writes it, a group as its JSON text), and false when
// line is no record of either format. Text groups stay dotted keys
// (body.name), as the text handler writes them.
func Fields(line string) (map[string]string, bool) {
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "{") {
		return jsonFields(line)
	}
	return textFields(line)
}

// Msg is the msg field of line ("" when it has none).
func Msg(line string) string {
	f, _ := Fields(line)
	return f["msg"]
}

// Has says whether line is a record whose msg is msg and whose fields
// include kv (key, value, key, value…).
func Has(line, msg string, kv ...string) bool {
	f, ok := Fields(line)
	if !ok || f["msg"] != msg {
		return false
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if v, ok := f[kv[i]]; !ok || v != kv[i+1] {
			return false
		}
	}
	return true
}

// Find returns the first line of text (several lines) that Has msg and
// kv, and whether there is one.
func Find(text, msg string, kv ...string) (string, bool) {
	for line := range strings.SplitSeq(text, "\n") {
		if Has(line, msg, kv...) {
			return line, true
		}
	}
	return "", false
}

func jsonFields(line string) (map[string]string, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal([]byte(line), &m) != nil {
		return nil, false
	}
	out := make(map[string]string, len(m))
	for k, raw := range m {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			out[k] = s
		} else {
			out[k] = string(raw)
		}
	}
	return out, true
}

// textFields parses key=value pairs separated by spaces, a value quoted
// (Go syntax) when the handler quoted it. A line without a msg key is no
// record.
func textFields(line string) (map[string]string, bool) {
	out := map[string]string{}
	for rest := line; rest != ""; {
		rest = strings.TrimLeft(rest, " ")
		if rest == "" {
			break
		}
		key, after, ok := strings.Cut(rest, "=")
		if !ok || key == "" || strings.ContainsAny(key, " \"") {
			return nil, false
		}
		v, tail, err := textValue(after)
		if err != nil {
			return nil, false
		}
		out[key] = v
		rest = tail
	}
	if _, ok := out["msg"]; !ok {
		return nil, false
	}
	return out, true
}

func textValue(s string) (value, rest string, err error) {
	if strings.HasPrefix(s, `"`) {
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			return "", "", fmt.Errorf("logline: bad quoted value: %w", err)
		}
		v, err := strconv.Unquote(q)
		if err != nil {
			return "", "", err
		}
		return v, s[len(q):], nil
	}
	v, rest, _ := strings.Cut(s, " ")
	return v, rest, nil
}
