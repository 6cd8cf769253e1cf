package algorithms

// PartialError is a store's error for a request it decided in part: the
// zones marked in Failed (each FailApart) could not be decided (their part
// of the store, a Redis Cluster shard, failed) and were not charged; the
// others were decided, their decisions in out and their charges taken
// (none refused). A store returns it only so; otherwise it fails the
// request as a whole.
type PartialError struct {
	Err    error
	Failed []bool // per request, as reqs
}

func (e *PartialError) Error() string { return e.Err.Error() }
func (e *PartialError) Unwrap() error { return e.Err }
