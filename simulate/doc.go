// Package simulate is `caddy rate-limit simulate`: traffic (Caddy's JSON
// access logs, a CSV of time,key,path,cost, or a built-in pattern)
// replayed through a configuration's rate_limit zones with the production
// code on a virtual clock.
//
// The configuration is provisioned in this process as Caddy would run it
// (caddy.ProvisionContext: its http app, servers, routes, matchers, vars
// and map handlers and the rate_limit handlers themselves), with nothing
// listening; each request of the traffic is a synthetic *http.Request
// served by the compiled server (caddyhttp.Server.ServeHTTP) at its
// instant of the virtual clock. Handlers that reach the network or the
// disk are replaced (see rewrite), and every rate_limit store is the
// simulator's (Store): the memory store on the virtual clock, which
// records every decision for the report.
//
// The package registers the command (caddycmd.RegisterCommand) and its
// two guest modules; the plugin's root package imports it, so every build
// with the plugin has the command.
package simulate
