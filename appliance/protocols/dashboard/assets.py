"""The dashboard's inline style and script; the page loads nothing else.

The script polls STATE_PATH (the JSON of ``state.collect``) every POLL_MS
and keeps what it needs in the browser: the raw readings of the last few
seconds (the tables' rates) and one derived point per poll for ten minutes
(the charts). Counters are cumulative, so a point is the difference between
two readings over the time between them; latency quantiles come from the
difference of the cumulative histogram buckets, interpolated within a
bucket as Prometheus' histogram_quantile does. Charts are inline SVG.
"""

from __future__ import annotations

STYLE = """
body{font:14px system-ui,sans-serif;margin:1.2em 1.5em;color:#1d232a;background:#fafbfc}
header{display:flex;flex-wrap:wrap;align-items:center;gap:.8em}
h1{font-size:1.5em;margin:0}h2{font-size:1.1em;margin:1.4em 0 .4em}
.badge{padding:.25em .7em;border-radius:1em;font-weight:600;color:#fff}
.badge.ok{background:#1f883d}.badge.warn{background:#bf8700}.badge.off{background:#6e7781}
button{font:inherit;padding:.3em .9em;border:1px solid #8c959f;border-radius:.4em;
background:#fff;cursor:pointer}button:disabled{opacity:.5}
.muted{color:#57606a}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{background:#fff;border:1px solid #d0d7de;border-radius:.5em;padding:.5em 1em;min-width:8em}
.label{color:#57606a;font-size:.85em}.big{font-size:1.6em;font-variant-numeric:tabular-nums}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:.8em}
figure{margin:0;background:#fff;border:1px solid #d0d7de;border-radius:.5em;padding:.5em}
figcaption{color:#57606a;font-size:.85em;margin-bottom:.3em}
svg{width:100%;height:200px;display:block}
svg .grid{stroke:#eaeef2}svg .axis{fill:#57606a;font-size:11px}
svg polyline{fill:none;stroke-width:1.6;vector-effect:non-scaling-stroke}
.legend{font-size:.85em;display:flex;flex-wrap:wrap;gap:.2em 1em;margin-top:.3em}
.legend i{display:inline-block;width:.8em;height:.8em;border-radius:.2em;margin-right:.3em}
table{border-collapse:collapse;background:#fff}
td,th{padding:.25em .7em;border-bottom:1px solid #eaeef2;text-align:left;
font-variant-numeric:tabular-nums}th{color:#57606a;font-weight:600}
.models td:nth-child(n+4),.models th:nth-child(n+4),.processes td:first-child,
.processes th:first-child,.processes td:nth-child(n+5),.processes th:nth-child(n+5){
text-align:right}
.chip{display:inline-block;font-size:.8em;padding:0 .4em;margin-left:.3em;border-radius:.3em;
background:#dafbe1}.chip.down{background:#ffebe9}
footer{margin-top:1.2em;color:#57606a;font-size:.85em}
"""

SCRIPT = """
(() => {
  const POLL = POLL_MS, KEEP_MS = 600000, WINDOW_MS = 5000;
  // Charts draw the busiest models only: two hundred lines would be one smear.
  const MOST_SERIES = 8;
  const COLORS = ['#0969da', '#cf222e', '#1f883d', '#8250df', '#bf8700', '#1b7c83',
                  '#e16f24', '#6e7781', '#bf3989', '#4d2d00'];
  const $ = (id) => document.getElementById(id);
  const colorOf = new Map();
  const ZERO = {success: 0, batches: 0, queue_ns: 0, compute_ns: 0, rows: 0};
  let readings = [JSON.parse($('initial').textContent)];
  let points = [];

  function color(name) {
    if (!colorOf.has(name)) colorOf.set(name, COLORS[colorOf.size % COLORS.length]);
    return colorOf.get(name);
  }
  const fixed = (x, digits) => (x === null || !isFinite(x)) ? '-' : x.toFixed(digits);
  const up = (a, b) => Math.max(0, (a || 0) - (b || 0));

  // The q-quantile (seconds) of calls whose cumulative bucket counts are `counts`.
  function quantile(q, bounds, counts) {
    const total = counts.length ? counts[counts.length - 1] : 0;
    if (!total) return null;
    const rank = q * total;
    for (let i = 0; i < counts.length; i++) {
      if (counts[i] >= rank) {
        if (bounds[i] === null) return bounds[i - 1] || null;
        const low = i ? bounds[i - 1] : 0, below = i ? counts[i - 1] : 0;
        const inside = counts[i] - below;
        return inside ? low + (bounds[i] - low) * (rank - below) / inside : bounds[i];
      }
    }
    return null;
  }

  // Rates and latency between two readings a (older) and b.
  function derive(a, b) {
    const dt = (b.time_ms - a.time_ms) / 1000, bounds = b.traffic.bounds;
    const point = {t: b.time_ms, models: {}, protocols: {}, rps: 0, eps: 0};
    const all = bounds.map(() => 0);
    for (const [name, now] of Object.entries(b.traffic.models)) {
      const old = a.traffic.models[name] || {ok: 0, fail: 0, seconds: 0, count: 0, buckets: []};
      const calls = up(now.ok + now.fail, old.ok + old.fail), count = up(now.count, old.count);
      const buckets = now.buckets.map((c, i) => up(c, old.buckets[i]));
      buckets.forEach((c, i) => { all[i] += c; });
      point.models[name] = {
        rate: calls / dt, err: up(now.fail, old.fail) / dt,
        mean: count ? 1000 * up(now.seconds, old.seconds) / count : null,
        p99: quantile(0.99, bounds, buckets),
      };
      point.rps += calls / dt;
      point.eps += up(now.fail, old.fail) / dt;
    }
    for (const [name, n] of Object.entries(b.traffic.protocols)) {
      point.protocols[name] = up(n, a.traffic.protocols[name]) / dt;
    }
    point.p50 = quantile(0.5, bounds, all);
    point.p99 = quantile(0.99, bounds, all);
    return point;
  }

  function niceTop(x) {
    if (!(x > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
    return 10 * p;
  }
  const label = (ms) => ms >= 120000 ? Math.round(ms / 60000) + ' min'
                                      : Math.round(ms / 1000) + ' s';

  // series: [{name, dash, values: [[t, v or null], ...]}]
  function chart(key, series, unit) {
    // Draw in the element's own pixels, so text is never stretched.
    const box = $('chart-' + key), W = box.clientWidth || 640, H = 200;
    const L = 46, R = 8, T = 8, B = 20;
    box.setAttribute('viewBox', `0 0 ${W} ${H}`);
    const now = points.length ? points[points.length - 1].t : Date.now();
    const first = points.length ? points[0].t : now;
    const span = Math.min(KEEP_MS, Math.max(60000, now - first));
    let top = 0;
    series.forEach((s) => s.values.forEach(([, v]) => { if (v !== null) top = Math.max(top, v); }));
    top = niceTop(top);
    const x = (t) => L + (W - L - R) * (1 - (now - t) / span);
    const y = (v) => T + (H - T - B) * (1 - v / top);
    let svg = '';
    for (const f of [0, 0.5, 1]) {
      svg += `<line class="grid" x1="${L}" x2="${W - R}" y1="${y(f * top)}" y2="${y(f * top)}"/>`;
      svg += `<text class="axis" x="${L - 4}" y="${y(f * top) + 4}" text-anchor="end">` +
             `${+(f * top).toPrecision(3)}${unit}</text>`;
    }
    svg += `<text class="axis" x="${L}" y="${H - 4}">-${label(span)}</text>`;
    svg += `<text class="axis" x="${W - R}" y="${H - 4}" text-anchor="end">now</text>`;
    for (const s of series) {
      let run = [];
      const flush = () => {
        if (run.length) svg += `<polyline stroke="${color(s.name)}"` +
          (s.dash ? ' stroke-dasharray="5 3"' : '') + ` points="${run.join(' ')}"/>`;
        run = [];
      };
      for (const [t, v] of s.values) {
        if (v === null || now - t > span) flush();
        else run.push(x(t).toFixed(1) + ',' + y(v).toFixed(1));
      }
      flush();
    }
    box.innerHTML = svg;
    const legend = $('legend-' + key);
    legend.textContent = '';
    for (const s of series) {
      const item = document.createElement('span'), swatch = document.createElement('i');
      swatch.style.background = color(s.name);
      item.append(swatch, s.name);
      legend.append(item);
    }
  }

  // "200 models: 198 ready, 2 not ready", as html.tally writes it.
  function tally(noun, states) {
    const counts = new Map();
    for (const s of states) counts.set(s, (counts.get(s) || 0) + 1);
    const ranked = [...counts].sort((a, b) => b[1] - a[1]).map(([s, n]) => `${n} ${s}`);
    return `${states.length} ${noun}: ` + ranked.join(', ');
  }

  function busiest(names) {
    if (names.length <= MOST_SERIES) return names;
    const load = new Map(names.map((n) => [n, 0]));
    for (const p of points) {
      for (const n of names) if (p.models[n]) load.set(n, load.get(n) + p.models[n].rate);
    }
    return names.slice().sort((a, b) => load.get(b) - load.get(a)).slice(0, MOST_SERIES);
  }

  function drawCharts(latest) {
    const all = latest.models.map((m) => m.name);
    if (latest.traffic.models['(unknown)']) all.push('(unknown)');
    const names = busiest(all);
    const pick = (fn) => points.map((p) => [p.t, fn(p)]);
    const byModel = (key, none) => names.map((n) => ({
      name: n, values: pick((p) => p.models[n] ? p.models[n][key] : none)}));
    chart('rate', byModel('rate', 0), '');
    const latency = byModel('mean', null);
    latency.push({name: 'p99 all', dash: true,
                  values: pick((p) => p.p99 === null ? null : 1000 * p.p99)});
    chart('latency', latency, '');
    if (names.length < all.length) {
      for (const key of ['rate', 'latency']) {
        const note = document.createElement('span');
        note.textContent = `(the busiest ${names.length} of ${all.length} models)`;
        $('legend-' + key).append(note);
      }
    }
    const protocols = Object.keys(latest.traffic.protocols).sort();
    chart('protocol', protocols.map((n) => ({
      name: n, values: pick((p) => p.protocols[n] || 0)})), '');
  }

  function row(body, values) {
    const tr = body.insertRow();
    for (const v of values) {
      const td = tr.insertCell();
      if (v instanceof Node) td.append(v); else td.textContent = v;
    }
  }

  function instances(model) {
    const box = document.createElement('span');
    const ready = model.instances.filter((i) => i.state === 'ready').length;
    box.append(`${ready}/${model.instances.length} ready`);
    for (const i of model.instances) {
      const chip = document.createElement('span');
      chip.className = 'chip' + (i.state === 'ready' ? '' : ' down');
      chip.textContent = `#${i.instance} ${i.state} pid ${i.pid || '-'} q ${i.depth}`;
      box.append(chip);
    }
    if (model.why) box.title = model.why;
    return box;
  }

  function drawModels(a, b) {
    const span = derive(a, b), body = $('models');
    body.textContent = '';
    const olds = new Map(a.models.map((m) => [m.name, m]));
    for (const m of b.models) {
      let o = olds.get(m.name);
      // New instances (a reload, a restart) start their counters at 0.
      if (!o || m.success < o.success || m.batches < o.batches) o = ZERO;
      const done = m.success - o.success, batches = m.batches - o.batches;
      const w = b.time_ms > a.time_ms ? span.models[m.name] : null;
      const calls = b.traffic.models[m.name] || {ok: 0, fail: 0};
      row(body, [m.name, m.ready ? 'ready' : 'not ready', instances(m),
        w ? fixed(w.rate, 1) : '-', w ? fixed(w.err, 1) : '-',
        w ? fixed(w.mean, 2) : '-', w && w.p99 !== null ? fixed(1000 * w.p99, 2) : '-',
        done ? fixed((m.queue_ns - o.queue_ns) / done / 1e6, 2) : '-',
        batches ? fixed((m.compute_ns - o.compute_ns) / batches / 1e6, 2) : '-',
        batches ? fixed((m.rows - o.rows) / batches, 1) : '-',
        String(Math.round(calls.ok + calls.fail)), String(Math.round(calls.fail))]);
    }
    for (const name of b.unloaded) row(body, [name, 'unloaded', '-']);
    const states = b.models.map((m) => m.ready ? 'ready' : 'not ready');
    $('models-summary').textContent = tally('models',
                                            [...states, ...b.unloaded.map(() => 'unloaded')]);
    if (b.time_ms > a.time_ms) {
      $('rps').textContent = fixed(span.rps, 1);
      $('eps').textContent = fixed(span.eps, 1);
      $('p50').textContent = span.p50 === null ? '-' : fixed(1000 * span.p50, 2) + ' ms';
      $('p99').textContent = span.p99 === null ? '-' : fixed(1000 * span.p99, 2) + ' ms';
    }
  }

  function drawProcesses(latest) {
    const body = $('processes');
    body.textContent = '';
    for (const p of latest.processes) {
      row(body, [String(p.pid || '-'), p.role, p.model || '-', p.state,
        p.restarts === null ? '-' : String(p.restarts),
        p.rss_bytes === null ? '-' : fixed(p.rss_bytes / 1e6, 1) + ' MB',
        p.cpu_percent === null ? '-' : fixed(p.cpu_percent, 1) + ' %',
        !p.device ? '-' : p.device.startsWith('cuda') && p.device_memory_bytes
          ? p.device + ' (' + fixed(p.device_memory_bytes / 1e6, 1) + ' MB)' : p.device]);
    }
    $('processes-summary').textContent = tally('processes', latest.processes.map((p) => p.state));
  }

  function drawHeader(s) {
    const words = [s.online ? 'online' : 'offline', s.ready ? 'ready' : 'not ready'];
    if (s.draining) words.push('draining');
    if (s.master && s.master.reloading) words.push('reloading');
    const badge = $('badge');
    badge.textContent = words.join(', ');
    badge.className = 'badge ' + (!s.online ? 'off' : s.ready ? 'ok' : 'warn');
    $('toggle').textContent = s.online ? 'Take offline' : 'Bring online';
    const m = s.master;
    if (!m) { $('host').textContent = 'master not answering'; return; }
    const up = m.uptime_s < 120 ? Math.round(m.uptime_s) + ' s' : m.uptime_s < 7200
      ? Math.round(m.uptime_s / 60) + ' min' : (m.uptime_s / 3600).toFixed(1) + ' h';
    const ports = Object.entries(m.ports || {}).map(([k, v]) => k + ' ' + v);
    const host = [`tree ${m.tree}`, `master pid ${m.pid}`, `up ${up}`, ...ports];
    $('host').textContent = host.join(' · ');
  }

  function draw(latest) {
    drawHeader(latest);
    drawModels(readings[0], latest);
    drawProcesses(latest);
    drawCharts(latest);
    $('updated').textContent = 'updated ' + new Date(latest.time_ms).toLocaleTimeString() +
      '; refreshes every ' + POLL / 1000 + ' s';
  }

  function take(latest) {
    const previous = readings[readings.length - 1];
    if (latest.time_ms <= previous.time_ms) return;  // a late answer: the next poll is newer
    // A reading right after another (the button's) would make a noisy point.
    if (latest.time_ms - previous.time_ms >= POLL / 2) points.push(derive(previous, latest));
    readings.push(latest);
    while (readings.length > 2 && latest.time_ms - readings[1].time_ms >= WINDOW_MS) {
      readings.shift();
    }
    while (points.length && latest.time_ms - points[0].t > KEEP_MS) points.shift();
    draw(latest);
  }

  function poll() {
    fetch('STATE_PATH', {cache: 'no-store'})
      .then((r) => { if (!r.ok) throw new Error('HTTP ' + r.status); return r.json(); })
      .then(take)
      .catch((e) => {
        $('badge').textContent = 'unreachable (' + e.message + ')';
        $('badge').className = 'badge off';
      })
      .finally(() => setTimeout(poll, POLL));
  }

  $('toggle').addEventListener('click', () => {
    const button = $('toggle'), want = !readings[readings.length - 1].online;
    button.disabled = true;
    fetch('ONLINE_PATH', {method: 'POST', headers: {'Content-Type': 'application/json'},
                         body: JSON.stringify({online: want})})
      .then((r) => r.json().then((body) => {
        $('message').textContent = r.ok ? '' : (body.error || 'HTTP ' + r.status);
        return fetch('STATE_PATH', {cache: 'no-store'}).then((s) => s.json()).then(take);
      }))
      .catch((e) => { $('message').textContent = String(e); })
      .finally(() => { button.disabled = false; });
  });

  draw(readings[0]);
  setTimeout(poll, POLL);
})();
"""
