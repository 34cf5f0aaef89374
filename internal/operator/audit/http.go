package audit

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
)

// Handler serves the auditor's state: a small HTML page at /, the last pass's report and the
// recent violations as JSON at /violations.json, and metrics (the handler given, if not nil) at
// /metrics.
func (a *Auditor) Handler(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	mux.HandleFunc("GET /violations.json", func(w http.ResponseWriter, _ *http.Request) {
		last, recent := a.Last()
		if recent == nil {
			recent = []Violation{}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			Group  string      `json:"group"`
			Last   *Report     `json:"last_pass"`
			Recent []Violation `json:"recent"`
		}{a.cfg.Group, last, recent})
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		last, recent := a.Last()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := page.Execute(w, struct {
			Group  string
			Last   *Report
			Recent []Violation
		}{a.cfg.Group, last, recent}); err != nil {
			http.Error(w, fmt.Sprint(err), http.StatusInternalServerError)
		}
	})
	return mux
}

var page = template.Must(template.New("audit").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5"><title>baton audit: {{.Group}}</title>
<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}.bad{color:#b00}</style></head>
<body><h1>baton audit: group {{.Group}}</h1>
{{with .Last}}<p>last pass at {{.At.Format "2006-01-02 15:04:05Z07:00"}} took {{.Took}}: {{len .Violations}} violations ({{.New}} new),
{{.Partitions}} partitions, {{.Queries}} store queries, {{.Requests}} Kafka requests, {{.BytesRead}} bytes read from the output topics, {{.Republished}} re-published copies.</p>
{{range .Errors}}<p class="bad">source not read: {{.}}</p>{{end}}
{{range .Recreated}}<p>topic {{.Topic}} recreated (topic id stored with the fences {{.StoredID}}, on the brokers {{.BrokerID}}): {{.Fences}} fences not judged against the log until 'baton topics reset'</p>{{end}}{{else}}<p>no pass yet</p>{{end}}
<h2>violations (first seen, newest first)</h2>
{{if .Recent}}<table><tr><th>seen</th><th>check</th><th>partition</th><th>what</th><th>evidence</th></tr>
{{range .Recent}}<tr><td>{{.At.Format "15:04:05"}}</td><td class="bad">{{.Check}}</td><td>{{if .Topic}}{{.Topic}}/{{.Partition}}{{end}}</td><td>{{.What}}</td><td>{{range .Evidence}}{{.Name}}={{.Value}} {{end}}</td></tr>
{{end}}</table>{{else}}<p>none</p>{{end}}
<p><a href="/violations.json">violations.json</a> · <a href="/metrics">metrics</a></p>
</body></html>
`))
