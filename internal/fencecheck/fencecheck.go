package fencecheck

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/batonhq/baton/fence"
)

// MaxIdentifierLen bounds the length of the strings in a fence.Key, of claimants and of
// keyed-fence scopes and ids (package fence documents it as 1024 bytes).
const MaxIdentifierLen = 1024

// ValidateKey returns an error wrapping fence.ErrInvalid if a name of k is not a valid
// identifier ([ValidateIdentifier]) or its partition is negative.
func ValidateKey(k fence.Key) error {
	if err := ValidateIdentifier("group", k.Group); err != nil {
		return err
	}
	if err := ValidateIdentifier("topic", k.Topic); err != nil {
		return err
	}
	if k.Partition < 0 {
		return fmt.Errorf("%w: partition %d is negative", fence.ErrInvalid, k.Partition)
	}
	return nil
}

// ValidateToken returns an error wrapping fence.ErrInvalid if either field of t is negative.
func ValidateToken(t fence.Token) error {
	if t.Era < 0 || t.Epoch < 0 {
		return fmt.Errorf("%w: token %d.%d has a negative field", fence.ErrInvalid, t.Era, t.Epoch)
	}
	return nil
}

// ValidateIdentifier checks a name used as (part of) a fence key, or as a keyed fence's scope
// or id: non-empty, at most [MaxIdentifierLen] bytes, valid UTF-8 without NUL bytes
// (PostgreSQL text cannot hold them).
func ValidateIdentifier(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", fence.ErrInvalid, what)
	case len(s) > MaxIdentifierLen:
		return fmt.Errorf("%w: %s is %d bytes, more than %d", fence.ErrInvalid, what, len(s), MaxIdentifierLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", fence.ErrInvalid, what)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return fmt.Errorf("%w: %s contains a NUL byte", fence.ErrInvalid, what)
		}
	}
	return nil
}

// CheckAdvance is the write rule every store applies, written once: it returns nil if a
// write of the batch first..last under t may advance a fence in state s. The token must equal
// the stored one: a lower token is a *fence.StaleError, a higher one fence.ErrNotClaimed
// (writes happen only under a claimed token, and since at most one claimant holds a token the
// token identifies the writer), a later era fence.ErrInvalid. Then the positions: last at or
// below the stored position is fence.ErrDuplicate (skip the batch), first at or below it
// fence.ErrOverlap (part of the batch was applied: reload, apply the suffix). Positions may
// have gaps (Kafka transaction markers, compaction), so the rule is "first > stored", not
// "first == stored+1". Stale wins over duplicate and overlap: a zombie must stop, not skip.
func CheckAdvance(k fence.Key, s fence.State, t fence.Token, first, last int64) error {
	if t.Compare(s.Token) < 0 {
		return &fence.StaleError{Key: k, Stored: s.Token, Presented: t}
	}
	if t.Era > s.Token.Era {
		return fmt.Errorf("%w: %s: token %s is of a later era than the stored %s; eras advance only through Recover", fence.ErrInvalid, k, t, s.Token)
	}
	if t != s.Token {
		return fmt.Errorf("%w: %s: token %s, stored %s; claim it first", fence.ErrNotClaimed, k, t, s.Token)
	}
	if last <= s.Position {
		return fmt.Errorf("%w: %s at %d..%d, stored position %d", fence.ErrDuplicate, k, first, last, s.Position)
	}
	if first <= s.Position {
		return fmt.Errorf("%w: %s: batch %d..%d, stored position %d", fence.ErrOverlap, k, first, last, s.Position)
	}
	return nil
}

// CheckClaim is the claim rule every store applies, written once: claimant may take the fence
// in state s with t if t is higher than the stored token, or equal to it and claimant already
// holds it (an idempotent re-claim) or nobody does (the zero token with no claimant: a fence
// never claimed). A lower token, or an equal one another claimant holds, is a
// *fence.StaleError (Stored == Presented for the latter); a token of a later era is
// fence.ErrInvalid (eras advance only through Recover). So at most one claimant ever holds a
// given token.
func CheckClaim(k fence.Key, s fence.State, t fence.Token, claimant string) error {
	if t.Compare(s.Token) < 0 {
		return &fence.StaleError{Key: k, Stored: s.Token, Presented: t}
	}
	if t.Era > s.Token.Era {
		return fmt.Errorf("%w: %s: token %s is of a later era than the stored %s; eras advance only through Recover", fence.ErrInvalid, k, t, s.Token)
	}
	if t == s.Token && s.Claimant != claimant && !(s.Claimant == "" && s.Token.IsZero()) {
		return &fence.StaleError{Key: k, Stored: s.Token, Presented: t}
	}
	return nil
}

// CheckAdmit is the keyed-fence rule every store applies, written once.
func CheckAdmit(storedToken fence.Token, storedSeq int64, found bool, t fence.Token, seq int64) fence.Verdict {
	if !found {
		return fence.Admitted
	}
	switch c := t.Compare(storedToken); {
	case c < 0:
		return fence.Stale
	case c == 0 && seq <= storedSeq:
		return fence.Duplicate
	}
	return fence.Admitted
}

// ValidateClaim checks the arguments of Claim.
func ValidateClaim(k fence.Key, t fence.Token, claimant string) error {
	if err := ValidateKey(k); err != nil {
		return err
	}
	if err := ValidateIdentifier("claimant", claimant); err != nil {
		return err
	}
	return ValidateToken(t)
}

// ValidateWrite checks the arguments of Apply and Advance: a batch of positions first..last,
// 0 <= first <= last.
func ValidateWrite(k fence.Key, t fence.Token, first, last int64) error {
	if err := ValidateKey(k); err != nil {
		return err
	}
	if err := ValidateToken(t); err != nil {
		return err
	}
	if first < 0 {
		return fmt.Errorf("%w: position %d is negative", fence.ErrInvalid, first)
	}
	if first > last {
		return fmt.Errorf("%w: batch %d..%d ends before it starts", fence.ErrInvalid, first, last)
	}
	return nil
}

// ValidateAdmit checks the arguments of KeyedSink.Admit.
func ValidateAdmit(scope, id string, t fence.Token, seq int64) error {
	if err := ValidateIdentifier("scope", scope); err != nil {
		return err
	}
	if err := ValidateIdentifier("id", id); err != nil {
		return err
	}
	if err := ValidateToken(t); err != nil {
		return err
	}
	if seq < 0 {
		return fmt.Errorf("%w: sequence %d is negative", fence.ErrInvalid, seq)
	}
	return nil
}

// ValidateRecover checks the arguments of Sink.Recover.
func ValidateRecover(k fence.Key, expected fence.Token, epoch int64, claimant, reason string) error {
	if err := ValidateKey(k); err != nil {
		return err
	}
	if err := ValidateIdentifier("claimant", claimant); err != nil {
		return err
	}
	if err := ValidateToken(expected); err != nil {
		return err
	}
	if epoch < 0 {
		return fmt.Errorf("%w: epoch %d is negative", fence.ErrInvalid, epoch)
	}
	if reason == "" {
		return fmt.Errorf("%w: a recovery needs a reason", fence.ErrInvalid)
	}
	return nil
}

// ValidateTopic checks the arguments of Topics.SeeTopic and the identities of
// Topics.ResetTopic: valid group and topic names, an ID of at most [MaxIdentifierLen]
// bytes of UTF-8 ("" for unknown), at least one partition.
func ValidateTopic(group, topic string, t fence.Topic) error {
	if err := ValidateKey(fence.Key{Group: group, Topic: topic}); err != nil {
		return err
	}
	if t.ID != "" {
		if err := ValidateIdentifier("topic id", t.ID); err != nil {
			return err
		}
	}
	if t.Partitions < 1 {
		return fmt.Errorf("%w: %s/%s: %d partitions", fence.ErrInvalid, group, topic, t.Partitions)
	}
	return nil
}

// CheckTopic is the topic rule every store and the consumer apply, written once. stored is
// what the sink holds for k's topic (found false: nothing), seen what the claimant sees. It
// returns the identity to store if the sink must adopt one (a topic never seen takes seen; a
// stored identity without an ID takes seen's ID and keeps its partition count, so growth is
// never adopted silently), and an error for a partition that must not be processed: a
// *fence.TopicError wrapping fence.ErrTopicRecreated when both IDs are known and differ, or
// fence.ErrTopicGrown when the topic has more partitions than the stored count (seen, or k's
// partition is at or above it): growing a topic moves keys between all its partitions, old
// and new, so every partition of a grown topic is refused until the growth is acknowledged.
func CheckTopic(k fence.Key, stored fence.Topic, found bool, seen fence.Topic) (adopt *fence.Topic, err error) {
	switch {
	case !found:
		a := seen
		a.Partitions = max(a.Partitions, k.Partition+1)
		return &a, nil
	case stored.ID == "" && seen.ID != "":
		a := fence.Topic{ID: seen.ID, Partitions: stored.Partitions}
		adopt, stored = &a, a
	}
	if stored.ID != "" && seen.ID != "" && stored.ID != seen.ID {
		return adopt, &fence.TopicError{Key: k, Stored: stored, Seen: seen}
	}
	if seen.Partitions = max(seen.Partitions, k.Partition+1); seen.Partitions > stored.Partitions {
		return adopt, &fence.TopicError{Key: k, Stored: stored, Seen: seen}
	}
	return adopt, nil
}

// CheckTopicReset is the rule of Topics.ResetTopic: the stored identity must be expected
// (fence.ErrConflict otherwise), the reset must change something, and a topic keeping its ID
// may not lose partitions (Kafka never shrinks a topic; fence.ErrInvalid). It reports whether
// the ID changes: then every fence of the topic moves to a new era with no position.
func CheckTopicReset(group, topic string, stored fence.Topic, found bool, expected, to fence.Topic) (recreated bool, err error) {
	if !found || stored != expected {
		return false, fmt.Errorf("%w: %s/%s: stored topic identity %s, expected %s", fence.ErrConflict, group, topic, stored, expected)
	}
	if to == stored {
		return false, fmt.Errorf("%w: %s/%s: the reset changes nothing (stored %s)", fence.ErrInvalid, group, topic, stored)
	}
	if to.ID == stored.ID && to.Partitions < stored.Partitions {
		return false, fmt.Errorf("%w: %s/%s: partitions %d -> %d: a topic never shrinks", fence.ErrInvalid, group, topic, stored.Partitions, to.Partitions)
	}
	return to.ID != stored.ID, nil
}

// ValidateReset checks the arguments of Topics.ResetTopic.
func ValidateReset(group, topic string, expected, to fence.Topic, reason string) error {
	var errs []error
	errs = append(errs, ValidateTopic(group, topic, expected), ValidateTopic(group, topic, to))
	if reason == "" {
		errs = append(errs, fmt.Errorf("%w: a topic reset needs a reason", fence.ErrInvalid))
	}
	return errors.Join(errs...)
}

// ResetToken is the token every fence of a recreated topic takes at ResetTopic: the next era,
// epoch 0, no claimant, so that the next owner claims it at any generation and no token of
// the old incarnation is accepted again. A sealed fence (epoch SealedEpoch, which no claim
// in its era reaches) stays sealed: the next era, epoch SealedEpoch, and the store keeps its
// claimant; a reset never makes a sealed fence claimable.
func ResetToken(stored fence.Token) fence.Token {
	if Sealed(stored) {
		return fence.Token{Era: stored.Era + 1, Epoch: SealedEpoch}
	}
	return fence.Token{Era: stored.Era + 1}
}

// SealedEpoch is the epoch of a sealed fence's token (the shard router's retired fences).
const SealedEpoch = math.MaxInt64

// Sealed reports whether a fence holding t is sealed: a topic reset keeps its epoch and its
// claimant ([ResetToken]).
func Sealed(t fence.Token) bool { return t.Epoch == SealedEpoch }
