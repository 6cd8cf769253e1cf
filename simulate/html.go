package simulate

import "io"

// WriteHTML writes the self-contained HTML report.
func (r *Report) WriteHTML(w io.Writer) error { return nil }
