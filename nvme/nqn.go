package nvme

// MaxNQNLen is the longest NQN the specification allows, in bytes,
// excluding the NUL terminator.
const MaxNQNLen = 223

// DiscoveryNQN is the well-known NQN of a discovery subsystem.
const DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// ValidateNQN checks that s is a well-formed NVMe Qualified Name:
//
//	nqn.YYYY-MM.reverse.domain[:anything]
//
// at most MaxNQNLen bytes, with a four-digit year, a month 01-12, a
// reverse domain of letters, digits, '-' and '.' with no empty label, and
// no control characters anywhere. This covers the UUID form
// (nqn.2014-08.org.nvmexpress:uuid:...) and the discovery NQN, which has no
// ':' part. It does not allocate.
func ValidateNQN(s string) error {
	return validateNQN(s)
}

// validateNQN serves both string and []byte callers without converting,
// so neither allocates.
func validateNQN[T string | []byte](b T) error {
	if len(b) == 0 || len(b) > MaxNQNLen {
		return ErrNQNLength
	}
	// "nqn." + YYYY + "-" + MM + "." is 12 bytes, then at least one domain
	// byte.
	if len(b) < 13 || string(b[:4]) != "nqn." || b[8] != '-' || b[11] != '.' {
		return ErrNQN
	}
	for _, i := range [...]int{4, 5, 6, 7, 9, 10} {
		if b[i] < '0' || b[i] > '9' {
			return ErrNQN
		}
	}
	month := int(b[9]-'0')*10 + int(b[10]-'0')
	if month < 1 || month > 12 {
		return ErrNQN
	}
	rest := b[12:]
	end := len(rest)
	for i := 0; i < len(rest); i++ {
		if rest[i] == ':' {
			end = i
			break
		}
	}
	domain := rest[:end]
	if len(domain) == 0 || domain[0] == '.' || domain[len(domain)-1] == '.' {
		return ErrNQN
	}
	prev := byte(0)
	for i := 0; i < len(domain); i++ {
		ch := domain[i]
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9', ch == '-':
		case ch == '.':
			if prev == '.' {
				return ErrNQN
			}
		default:
			return ErrNQN
		}
		prev = ch
	}
	for i := end; i < len(rest); i++ {
		if ch := rest[i]; ch < 0x20 || ch == 0x7F {
			return ErrNQN
		}
	}
	return nil
}
