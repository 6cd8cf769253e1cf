// Sluice live page (the rate_limit_ui directive): polls the JSON beside it
// (same origin) and draws the zones, their decisions per second and the
// keys refused recently.
"use strict";
(function () {
  const base = location.pathname.replace(/\/ui$/, "/"); // the page is at <base> or <base>ui
  const pollMs = 2000;
  const history = 30; // samples kept per zone (one a poll)
  const hist = new Map(); // zone → [{t, allowed, refused}]
  let last = null;

  const $ = (sel) => document.querySelector(sel);
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  };
  const svgEl = (tag, attrs) => {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  };

  async function getJSON(path, opts) {
    const r = await fetch(base + path, Object.assign({ cache: "no-store", headers: { Accept: "application/json" } }, opts || {}));
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
    return body;
  }

  function limitText(z) {
    if (z.algorithm === "concurrency") return z.concurrent + " in flight";
    if (z.algorithm === "adaptive" && z.adaptive) {
      const a = z.adaptive;
      let s = a.limit + " in flight (adaptive " + a.controller;
      const ms = (v) => +v.toPrecision(3) + " ms";
      if (a.latency_ms) s += "; latency " + ms(a.latency_ms) + ", baseline " + ms(a.baseline_ms);
      return s + ")";
    }
    let s = z.events + " / " + z.window;
    if (z.burst) s += ", burst " + z.burst;
    return s;
  }

  function sparkline(samples) {
    const w = 160, h = 34;
    const svg = svgEl("svg", { class: "spark", width: w, height: h, viewBox: "0 0 " + w + " " + h, "data-series": "2", "data-points": samples.length });
    svg.append(svgEl("rect", { class: "frame", x: 0, y: 0, width: w, height: h }));
    let peak = 1;
    for (const s of samples) peak = Math.max(peak, s.allowed, s.refused);
    for (const k of ["allowed", "refused"]) {
      const pts = samples.map((s, i) => {
        const x = samples.length > 1 ? (i * (w - 2)) / (history - 1) + 1 : w / 2;
        return x.toFixed(1) + "," + (h - 2 - ((h - 4) * s[k]) / peak).toFixed(1);
      });
      svg.append(svgEl("polyline", { class: "series " + k, points: pts.join(" "), "data-points": samples.length }));
    }
    return svg;
  }

  function storeCell(st, sy) {
    const td = el("td", {}, st.module || "?");
    // The asynchronous mode: decided here, synced every interval.
    if (sy) {
      let t = "async, sync every " + sy.interval + ", lag " + (sy.lag_ms < 0 ? "none yet" : sy.lag_ms + " ms");
      if (sy.failures) t += ", " + sy.failures + " failed syncs, " + sy.held + " units held";
      td.append(el("div", { class: "sync" + (sy.failures ? " problem" : ""), title: sy.bound }, t));
    }
    if (st.circuit) td.append(" ", el("span", { class: "badge " + st.circuit, title: "circuit breaker" }, "breaker " + st.circuit));
    if (st.target) td.append(el("div", { class: "token" }, st.target.replaceAll(",", ", "))); // a Cluster's seeds wrap
    // What Redis refuses this user (ACL), naming what to grant.
    if (st.problem) td.append(el("div", { class: "problem" }, st.problem));
    // A Cluster's breaker is per master: one line each.
    if (st.nodes && st.nodes.length > 1) {
      for (const n of st.nodes) {
        td.append(el("div", { class: "node", "data-node": n.node }, el("span", { class: "token" }, n.node), " ",
          el("span", { class: "badge " + n.circuit, title: "circuit breaker: " + n.outages + " outages, " + n.failures + " failures, " + n.fast_failures + " failed fast" }, n.circuit)));
      }
    }
    return td;
  }

  function render(zones, act) {
    const byName = new Map(act.zones.map((z) => [z.name, z]));
    const tbody = el("tbody");
    for (const z of zones.zones) {
      const a = byName.get(z.name) || { allowed: 0, refused: 0, vetoed: 0, report_only_refused: 0 };
      const refusedNow = a.refused + a.report_only_refused;
      let h = hist.get(z.name);
      if (!h) hist.set(z.name, (h = []));
      let ar = 0, rr = 0;
      if (last && last.byName.has(z.name)) {
        const p = last.byName.get(z.name), dt = Math.max(0.001, (act.now_ms - last.now) / 1000);
        ar = Math.max(0, a.allowed - p.allowed) / dt;
        rr = Math.max(0, refusedNow - p.refused - p.report_only_refused) / dt;
        h.push({ allowed: ar, refused: rr });
        if (h.length > history) h.shift();
      }
      tbody.append(el("tr", { "data-zone": z.name },
        el("td", {}, el("strong", {}, z.name), z.report_only ? " (report only)" : "", z.on_exceed === "pass" ? " (on_exceed pass)" : "", z.enabled ? "" : " (off)"),
        el("td", {}, z.algorithm),
        el("td", { class: "limit" }, limitText(z)),
        el("td", { class: "token" }, z.key.join(" ")),
        storeCell(z.store || {}, z.sync),
        el("td", { class: "num allowed" }, ar.toFixed(1)),
        el("td", { class: "num refused" }, rr.toFixed(1)),
        el("td", {}, sparkline(h)),
        el("td", { class: "num" }, a.allowed),
        el("td", { class: "num" }, a.refused),
        el("td", { class: "num" }, a.vetoed),
        el("td", { class: "num" }, a.report_only_refused)));
    }
    if (!zones.zones.length) tbody.append(el("tr", {}, el("td", { colspan: 12, class: "empty" }, "no rate_limit zone in the active configuration")));
    $("#zones tbody").replaceWith(tbody);

    const rows = [];
    for (const z of act.zones) for (const r of z.recent) rows.push(Object.assign({ zone: z.name }, r));
    rows.sort((x, y) => y.at_ms - x.at_ms);
    const rb = el("tbody");
    for (const r of rows.slice(0, 50)) {
      const age = Math.max(0, Math.round((act.now_ms - r.at_ms) / 1000));
      rb.append(el("tr", { "data-zone": r.zone, "data-token": r.token },
        el("td", { title: r.at }, age + "s ago"),
        el("td", { class: "zone" }, r.zone + (r.passed ? " (passed)" : r.report_only ? " (report only)" : "")),
        el("td", { class: "token" }, r.token),
        el("td", { class: "num count" }, r.count),
        el("td", { class: "num" }, Math.ceil(r.retry_after_ms / 1000) + "s"),
        el("td", {},
          el("button", { class: "peek", onclick: () => peek(r.zone, r.token) }, "peek"), " ",
          el("button", { class: "reset danger", onclick: () => reset(r.zone, r.token) }, "reset…"))));
    }
    if (!rows.length) rb.append(el("tr", {}, el("td", { colspan: 6, class: "empty" }, "no refusal yet")));
    $("#recent tbody").replaceWith(rb);
    last = { now: act.now_ms, byName };
  }

  const keyPath = (zone, token) => "zones/" + encodeURIComponent(zone) + "/tokens/" + encodeURIComponent(token);

  async function peek(zone, token) {
    try {
      const p = await getJSON(keyPath(zone, token));
      $("#detail").textContent = "GET " + zone + " " + token + "\n" + JSON.stringify(p, null, 2);
    } catch (e) {
      $("#detail").textContent = "peek failed: " + e.message;
    }
  }

  function reset(zone, token) {
    const d = $("#confirm");
    $("#confirm-text").textContent = "Reset " + token + " in zone " + zone + "? Its next request gets a full allowance.";
    d.returnValue = "";
    d.onclose = async () => {
      if (d.returnValue !== "ok") return;
      try {
        const r = await getJSON(keyPath(zone, token), { method: "DELETE" });
        $("#detail").textContent = "DELETE " + zone + " " + token + "\n" + JSON.stringify(r, null, 2);
        await peek(zone, token).then(() => { $("#detail").textContent = "DELETE " + zone + " " + token + "\n" + JSON.stringify(r, null, 2) + "\n\nafter:\n" + $("#detail").textContent; });
      } catch (e) {
        $("#detail").textContent = "reset failed: " + e.message;
      }
    };
    d.showModal();
  }

  // Overrides: the form sets one (PUT, same origin) and the table lists
  // every rate zone's, each with a delete button.
  const ovPath = (zone, key) => "zones/" + encodeURIComponent(zone) + "/overrides" + (key ? "/" + encodeURIComponent(key) : "");

  function overrideText(o) {
    if (o.kind !== "limit") return o.kind;
    return o.events + " / " + o.window + (o.burst ? ", burst " + o.burst : "");
  }

  async function renderOverrides(zones) {
    // A zone in the asynchronous mode (sync) takes no override.
    const rate = zones.zones.filter((z) => z.algorithm !== "concurrency" && z.algorithm !== "adaptive" && !z.sync);
    const sel = $("#ov-zone");
    const names = rate.map((z) => z.name);
    if ([...sel.options].map((o) => o.value).join() !== names.join()) {
      const keep = sel.value;
      sel.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
      if (names.includes(keep)) sel.value = keep;
    }
    const lists = await Promise.all(rate.map((z) => getJSON(ovPath(z.name)).catch(() => ({ zone: z.name, overrides: [] }))));
    const tb = el("tbody");
    for (const l of lists) {
      for (const o of l.overrides) {
        tb.append(el("tr", { "data-zone": l.zone, "data-token": o.token },
          el("td", {}, l.zone), el("td", { class: "token" }, o.token), el("td", { class: "override" }, overrideText(o)),
          el("td", { title: o.expires }, new Date(o.expires_ms).toLocaleString()), el("td", {}, o.reason), el("td", { class: "token" }, o.by),
          el("td", {}, el("button", { class: "ov-delete danger", onclick: () => deleteOverride(l.zone, o.token) }, "delete"))));
      }
    }
    if (!tb.children.length) tb.append(el("tr", {}, el("td", { colspan: 7, class: "empty" }, "none")));
    $("#overrides tbody").replaceWith(tb);
  }

  async function deleteOverride(zone, token) {
    try {
      const r = await getJSON(ovPath(zone, token), { method: "DELETE" });
      $("#detail").textContent = "DELETE override " + zone + " " + token + "\n" + JSON.stringify(r, null, 2);
    } catch (e) {
      $("#detail").textContent = "delete failed: " + e.message;
    }
    poll();
  }

  $("#override-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const body = { reason: f.get("reason") || "" };
    if (f.get("expires_in")) body.expires_in = f.get("expires_in");
    const kind = f.get("kind");
    if (kind === "block") body.block = true;
    else if (kind === "unlimited") body.unlimited = true;
    else {
      body.events = Number(f.get("events"));
      body.window = f.get("window");
      if (f.get("burst")) body.burst = Number(f.get("burst"));
    }
    try {
      const r = await getJSON(ovPath(f.get("zone"), f.get("key")), { method: "PUT", headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify(body) });
      $("#detail").textContent = "PUT override " + f.get("zone") + "\n" + JSON.stringify(r, null, 2);
    } catch (e) {
      $("#detail").textContent = "override refused: " + e.message;
    }
    poll();
  });

  async function poll() {
    try {
      const [zones, act] = await Promise.all([getJSON("zones"), getJSON("activity")]);
      render(zones, act);
      await renderOverrides(zones);
      const s = $("#status");
      s.className = "";
      s.textContent = "updated " + new Date(act.now_ms).toLocaleTimeString() + ", every " + pollMs / 1000 + "s";
    } catch (e) {
      const s = $("#status");
      s.className = "error";
      s.textContent = "error: " + e.message;
    }
  }
  poll();
  setInterval(poll, pollMs);
})();
