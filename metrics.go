package sluice

// countDecisions records the outcome of every zone of a decided request.
func countDecisions(s *admission, refused bool) {
	if len(s.zones) > 0 && s.zones[0].metrics != nil {
		recordActivity(s, refused) // for the live page (admin.go)
	}
	for i, z := range s.zones {
		if z.metrics == nil {
			return
		}
		wouldRefuse := !s.decs[i].Allowed
		switch {
		case wouldRefuse && z.pass.forward:
			z.metrics.Passed.Inc()
		case wouldRefuse && s.reqs[i].ReportOnly:
			z.metrics.ReportOnly.Inc()
		case !refused && s.decs[i].Delay > 0:
			z.metrics.Delayed.Inc()
		case !refused:
			z.metrics.Allowed.Inc()
		case wouldRefuse:
			z.metrics.Refused.Inc()
		default:
			z.metrics.Vetoed.Inc()
		}
	}
}
