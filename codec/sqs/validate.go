package sqs

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/ankusa/sinkbatch/codec"
)

// Codes of the permanent errors Validate answers with. Where SQS has a code
// for the same fault, the codec uses it.
const (
	CodeEmptyBody             = "EmptyBody"
	CodeInvalidMessageContent = "InvalidMessageContents"
	CodeTooManyAttributes     = "TooManyAttributes"
	CodeInvalidAttributeName  = "InvalidAttributeName"
	CodeInvalidAttributeValue = "InvalidAttributeValue"
	CodeMissingGroup          = "MissingMessageGroupId"
	CodeMissingDeduplication  = "MissingMessageDeduplicationId"
	CodeInvalidGroup          = "InvalidMessageGroupId"
	CodeInvalidDeduplication  = "InvalidMessageDeduplicationId"
)

// Validate reports whether SQS can ever accept m on this queue. It answers
// nil or a permanent *codec.EntryError that says what is wrong (or, for a
// message heavier than MaxMessageBytes, an error wrapping codec.ErrTooLarge).
func (c *Codec) Validate(m codec.Message) error {
	if len(m.Body) == 0 {
		return invalid(CodeEmptyBody, "the body is empty; SQS needs at least one character")
	}
	if err := checkBody(m.Body); err != "" {
		return invalid(CodeInvalidMessageContent, "the body "+err)
	}
	n := len(m.Attributes) + c.carried(m).count()
	if m.IdempotencyKey != "" {
		n++
	}
	if n > MaxAttributes {
		return invalid(CodeTooManyAttributes, fmt.Sprintf("%d message attributes (the idempotency key and the W3C trace context count); SQS allows %d", n, MaxAttributes))
	}
	if len(m.Attributes) > 0 {
		if err := c.checkAttributes(m); err != nil {
			return err
		}
	}
	if m.IdempotencyKey != "" {
		if err := checkAttributeValue(m.IdempotencyKey); err != "" {
			return invalid(CodeInvalidAttributeValue, "the idempotency key "+err)
		}
	}
	if c.fifo && m.Group == "" {
		return invalid(CodeMissingGroup, "a FIFO queue needs a Group (MessageGroupId) on every message")
	}
	if m.Group != "" {
		if err := checkID(m.Group); err != "" {
			return invalid(CodeInvalidGroup, "the Group (MessageGroupId) "+err)
		}
	}
	if c.fifo {
		if m.IdempotencyKey == "" && !c.cbd {
			return invalid(CodeMissingDeduplication, "a FIFO queue without content-based deduplication needs an IdempotencyKey (MessageDeduplicationId) on every message")
		}
		if m.IdempotencyKey != "" {
			if err := checkID(m.IdempotencyKey); err != "" {
				return invalid(CodeInvalidDeduplication, "the IdempotencyKey (MessageDeduplicationId) "+err)
			}
		}
	}
	if size := c.Size(m); size > c.maxMessage {
		return fmt.Errorf("sinkbatch/sqs: a message of %d bytes (body and attributes) exceeds %s, %d: %w", size, c.maxMessageFrom, c.maxMessage, codec.ErrTooLarge)
	}
	return nil
}

// checkAttributes is Validate's check of m's attributes, in a function of
// its own for the reason given at attributesSize.
func (c *Codec) checkAttributes(m codec.Message) error {
	names := make([]string, 0, len(m.Attributes))
	for k := range m.Attributes {
		names = append(names, k)
	}
	sort.Strings(names) // report the same fault first every time
	for _, k := range names {
		if err := checkAttributeName(k); err != "" {
			return invalid(CodeInvalidAttributeName, err)
		}
		if m.IdempotencyKey != "" && k == c.idemAttr {
			return invalid(CodeInvalidAttributeName, fmt.Sprintf("attribute %q is reserved for the idempotency key", k))
		}
		if err := checkAttributeValue(m.Attributes[k]); err != "" {
			return invalid(CodeInvalidAttributeValue, fmt.Sprintf("attribute %q %s", k, err))
		}
	}
	return nil
}

func invalid(code, msg string) error {
	return &codec.EntryError{Code: code, Message: msg, Permanent: true}
}

// allowedRune reports whether SQS accepts r in a body or attribute value:
// #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF.
func allowedRune(r rune) bool {
	switch {
	case r == 0x9 || r == 0xA || r == 0xD:
		return true
	case r >= 0x20 && r <= 0xD7FF:
		return true
	case r >= 0xE000 && r <= 0xFFFD:
		return true
	case r >= 0x10000 && r <= 0x10FFFF:
		return true
	}
	return false
}

// checkBody returns "" when SQS accepts b as text, or what is wrong.
func checkBody(b []byte) string {
	for i := 0; i < len(b); {
		if c := b[i]; c < utf8.RuneSelf { // ASCII: most bodies
			if c < 0x20 && c != 0x9 && c != 0xA && c != 0xD {
				return fmt.Sprintf("holds %U at byte %d, which SQS refuses", rune(c), i)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if msg := checkRune(r, n, i); msg != "" {
			return msg
		}
		i += n
	}
	return ""
}

// checkText is checkBody for a string.
func checkText(s string) string {
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c < 0x20 && c != 0x9 && c != 0xA && c != 0xD {
				return fmt.Sprintf("holds %U at byte %d, which SQS refuses", rune(c), i)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if msg := checkRune(r, n, i); msg != "" {
			return msg
		}
		i += n
	}
	return ""
}

// checkRune checks the non-ASCII rune r of n bytes at byte i.
func checkRune(r rune, n, i int) string {
	if r == utf8.RuneError && n <= 1 {
		return fmt.Sprintf("is not valid UTF-8 at byte %d", i)
	}
	if !allowedRune(r) {
		return fmt.Sprintf("holds %U at byte %d, which SQS refuses", r, i)
	}
	return ""
}

func checkAttributeValue(v string) string {
	if v == "" {
		return "is empty; SQS needs a non-empty String value"
	}
	return checkText(v)
}

// checkAttributeName returns "" when name is a valid SQS message attribute
// name: up to 256 of A-Z a-z 0-9 _ - ., not starting with "AWS." or
// "Amazon." in any case, not starting or ending with a period, without two
// periods in a row.
func checkAttributeName(name string) string {
	switch {
	case name == "":
		return "an attribute name is empty"
	case len(name) > 256:
		return fmt.Sprintf("attribute name %.20q... is %d characters; SQS allows 256", name, len(name))
	case strings.HasPrefix(strings.ToLower(name), "aws.") || strings.HasPrefix(strings.ToLower(name), "amazon."):
		return fmt.Sprintf("attribute name %q starts with a prefix SQS reserves", name)
	case strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") || strings.Contains(name, ".."):
		return fmt.Sprintf("attribute name %q has a leading, trailing or doubled period", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return fmt.Sprintf("attribute name %q holds %q; SQS allows A-Z a-z 0-9 _ - .", name, r)
		}
	}
	return ""
}

// checkID returns "" when id is a valid MessageGroupId or
// MessageDeduplicationId: 1 to 128 printable ASCII characters, no space.
func checkID(id string) string {
	if len(id) > MaxIDLength {
		return fmt.Sprintf("is %d characters; SQS allows %d", len(id), MaxIDLength)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7E {
			return fmt.Sprintf("holds byte %#x at %d; SQS allows printable ASCII without space", id[i], i)
		}
	}
	return ""
}
