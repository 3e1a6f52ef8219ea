// The dashboard page: fetches api/data (the same figures as JSON) and renders the
// all-agents table, the selected agent's figures and its charts (Chart.js, vendored),
// and api/stages (each stage's lag and errors now). Both are read again every
// `data-refresh-s` seconds (body attribute) while the page is visible, and redrawn in
// place. Text goes into the DOM with textContent only: agent ids are never markup.
"use strict";

(function () {
  const PALETTE = ["#3366cc", "#dc7633", "#2e9e5b", "#8e44ad", "#c0392b", "#17a2b8",
                   "#7f8c8d", "#d4ac0d"];
  const BREACH = "#c0392b";
  const state = { data: null, agent: null, charts: new Map(), loads: 0, timer: null };

  const $ = (selector) => document.querySelector(selector);
  const dash = "\u2013";
  const fmtInt = (n) => String(n);
  const fmtRate = (r) => (r === null ? dash : (r * 100).toFixed(1) + " %");
  const fmtMs = (x) => (x === null || x === undefined ? dash : x.toFixed(0));
  const fmtScore = (x) => (x === null || x === undefined ? dash : x.toFixed(3));
  const label = (key) => (key === "" ? "(none)" : key);

  // Costs with four significant digits (prices per token make them small: 0.00003000,
  // not 3.000000E-5), in the agent's currency when its policy names one.
  // `digits` fixes the decimals (an axis: the same for every tick).
  const formatters = new Map();
  function fmtCost(x, currency, digits) {
    const abs = Math.abs(x);
    if (digits === undefined) {
      digits = abs === 0 ? 2 : Math.min(8, Math.max(2, 3 - Math.floor(Math.log10(abs))));
    }
    const key = `${currency || ""}/${digits}`;
    if (!formatters.has(key)) {
      const options = { minimumFractionDigits: digits, maximumFractionDigits: digits };
      let format;
      try {
        format = currency
          ? new Intl.NumberFormat("en-US", { ...options, style: "currency", currency }).format
          : new Intl.NumberFormat("en-US", { ...options, useGrouping: false }).format;
      } catch (e) {  // a code Intl does not know: the number, then the code
        const plain = new Intl.NumberFormat("en-US", options).format;
        format = (v) => `${plain(v)} ${currency}`;
      }
      formatters.set(key, format);
    }
    return formatters.get(key)(x);
  }

  const fmtTime = (iso) => (iso ? iso.replace("T", " ").replace(/\.\d+/, "")
    .replace("+00:00", " UTC") : dash);

  function cell(row, field, text, cls) {
    const td = document.createElement("td");
    if (field) td.dataset.field = field;
    if (cls) td.className = cls;
    td.textContent = text;
    row.appendChild(td);
  }

  function feedbackText(fb) {
    return `${fb.total} (${fb.explicit} / ${fb.implicit})`;
  }

  const pairs = (obj, fmt) => Object.entries(obj)
    .map(([key, value]) => `${label(key)} ${fmt(value)}`).join(" \u00b7 ") || dash;

  function renderTable() {
    const body = $("#agents tbody");
    body.replaceChildren();
    for (const a of state.data.agents) {
      const t = a.totals;
      const row = document.createElement("tr");
      row.dataset.agent = a.agent_id;
      cell(row, "agent_id", a.agent_id);
      cell(row, "requests", fmtInt(t.requests));
      cell(row, "refused", fmtInt(t.refused));
      cell(row, "errors", fmtInt(t.errors));
      cell(row, "fallback_rate", fmtRate(t.fallback_rate));
      cell(row, "cost", fmtCost(t.cost, a.currency));
      cell(row, "p50", fmtMs(t.p50_ms));
      cell(row, "p95", fmtMs(t.p95_ms));
      cell(row, "slo", fmtMs(a.slo_p95_ms));
      cell(row, "slo_breaches", fmtInt(a.slo_breaches), a.slo_breaches ? "breach" : "");
      cell(row, "diverged", fmtInt(a.diverged), a.diverged ? "diverged" : "");
      cell(row, "feedback", feedbackText(a.feedback));
      row.addEventListener("click", () => select(a.agent_id));
      body.appendChild(row);
    }
    $("#no-agents").hidden = state.data.agents.length > 0;
    $("#range").textContent = `${state.data.since} \u2192 ${state.data.until} (UTC)`;
    const picker = $("#agent-select");
    picker.replaceChildren();
    for (const a of state.data.agents) {
      const option = document.createElement("option");
      option.value = a.agent_id;
      option.textContent = a.agent_id;
      picker.appendChild(option);
    }
  }

  function renderFreshness() {
    const d = state.data;
    const asOf = $("#as-of");
    asOf.textContent = `Data as of ${fmtTime(d.as_of)}`;
    asOf.dataset.asOf = d.as_of || "";
    const live = d.live_days;
    const refresh = Number(document.body.dataset.refreshS || 0);
    const every = refresh > 0 ? `; read again every ${refresh} s` : "";
    $("#freshness").textContent = live.length === 0
      ? `Every day from the daily rollups (final)${every}.`
      : `Live from the request log: ${live.length === 1 ? live[0]
        : `${live.length} days, ${live[0]} \u2192 ${live[live.length - 1]}`}` +
        ` (not rolled up yet); the other days from the daily rollups (final)${every}.`;
  }

  // One chart per canvas, kept across readings: new figures replace its data in place.
  function chart(id, config) {
    config.options = Object.assign({
      animation: false, responsive: true, maintainAspectRatio: false,
      interaction: { mode: "index", intersect: false },
      datasets: { bar: { maxBarThickness: 48 } },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
    }, config.options || {});
    const existing = state.charts.get(id);
    if (existing && existing.config.type === config.type) {
      existing.data = config.data;
      existing.options = config.options;
      existing.update("none");
      return;
    }
    if (existing) existing.destroy();
    state.charts.set(id, new Chart(document.getElementById(id), config));
  }

  function stacked(series) {
    return Object.entries(series).map(([key, values], i) => ({
      label: label(key), data: values, backgroundColor: PALETTE[i % PALETTE.length],
    }));
  }

  const stackedScales = { x: { stacked: true }, y: { stacked: true, beginAtZero: true } };

  function renderScores(a) {
    const body = $("#scores tbody");
    body.replaceChildren();
    for (const s of a.scores) {
      const row = document.createElement("tr");
      row.dataset.model = s.model;
      row.dataset.queryType = s.query_type;
      cell(row, "model", label(s.model));
      cell(row, "query_type", label(s.query_type));
      cell(row, "trials", s.trials.toFixed(0));
      cell(row, "score", fmtScore(s.score));
      cell(row, "global_score", fmtScore(s.global_score));
      const sign = s.divergence !== null && s.divergence > 0 ? "+" : "";
      cell(row, "divergence", s.divergence === null ? dash
        : sign + s.divergence.toFixed(3) + (s.diverged ? " (flagged)" : ""),
      s.diverged ? "diverged" : "");
      body.appendChild(row);
    }
    $("#no-scores").hidden = a.scores.length > 0;
  }

  // The daily series from day `from` on (arrays of per-day values, and maps of them).
  function spanned(daily, from) {
    const cut = (v) => (Array.isArray(v) ? v.slice(from)
      : Object.fromEntries(Object.entries(v).map(([k, xs]) => [k, xs.slice(from)])));
    return Object.fromEntries(Object.entries(daily).map(([k, v]) => [k, cut(v)]));
  }

  function renderAgent() {
    const a = state.data.agents.find((x) => x.agent_id === state.agent);
    $("#agent").hidden = !a;
    if (!a) {
      for (const c of state.charts.values()) c.destroy();
      state.charts.clear();
      return;
    }
    $("#agent-select").value = a.agent_id;
    for (const row of document.querySelectorAll("#agents tbody tr")) {
      row.classList.toggle("selected", row.dataset.agent === a.agent_id);
    }
    const t = a.totals;
    const money = (x) => fmtCost(x, a.currency);
    const tile = (field, text) => { $(`#tiles [data-field="${field}"]`).textContent = text; };
    tile("requests", fmtInt(t.requests));
    tile("refused", fmtInt(t.refused));
    if (t.refused) {
      const detail = document.createElement("span");
      detail.className = "detail";
      detail.textContent = pairs(a.refused, fmtInt);
      $('#tiles [data-field="refused"]').appendChild(detail);
    }
    tile("errors", fmtInt(t.errors));
    tile("fallback_rate", fmtRate(t.fallback_rate));
    tile("cost", money(t.cost));
    tile("tokens", `${t.tokens_in} / ${t.tokens_out}`);
    tile("p95", `${fmtMs(t.p95_ms)} (${a.slo_p95_ms === null ? "no SLO" : fmtMs(a.slo_p95_ms)})`);
    tile("slo_breaches", fmtInt(a.slo_breaches));
    tile("feedback", feedbackText(a.feedback));
    tile("diverged", `${a.diverged} of ${a.scores.length}`);

    // The charts span the agent's data: from its first day with any figure to the
    // window's end (a month's window with one day of data is one day wide).
    const from = Math.max(0, a.first_day ? state.data.days.indexOf(a.first_day) : 0);
    const d = spanned(a.daily, from);
    const days = state.data.days.slice(from);
    const labels = days.map((day) => day.slice(5));
    const legend = (field, text) => {
      $(`#agent [data-field="${field}"].legend`).textContent = text;
    };
    chart("chart-type", { type: "bar", data: { labels, datasets: stacked(d.by_type) },
                          options: { scales: stackedScales } });
    legend("by_type", pairs(a.by_type, fmtInt));
    chart("chart-layer", { type: "bar", data: { labels, datasets: stacked(d.by_layer) },
                           options: { scales: stackedScales } });
    legend("by_layer", pairs(a.by_layer, fmtInt));

    const latency = [
      { label: "p50 ms", data: d.p50_ms, borderColor: PALETTE[0], backgroundColor: PALETTE[0] },
      { label: "p95 ms", data: d.p95_ms, borderColor: PALETTE[1],
        pointBackgroundColor: d.breach.map((b) => (b ? BREACH : PALETTE[1])),
        pointRadius: d.breach.map((b) => (b ? 5 : 2)) },
    ];
    if (a.slo_p95_ms !== null) {
      latency.push({ label: "SLO p95", data: labels.map(() => a.slo_p95_ms),
                     borderColor: BREACH, borderDash: [6, 4], pointRadius: 0 });
    }
    chart("chart-latency", { type: "line", data: { labels, datasets: latency },
                             options: { scales: { y: { beginAtZero: true } } } });
    const breached = days.filter((_, i) => d.breach[i]);
    legend("breach_days", a.slo_p95_ms === null ? "No SLO set"
      : breached.length ? `Breached on ${breached.join(", ")}` : "No breach");

    chart("chart-fallback", {
      type: "line",
      data: { labels, datasets: [{ label: "fallback %", borderColor: PALETTE[3],
        data: d.fallback_rate.map((r) => (r === null ? null : r * 100)) }] },
      options: { scales: { y: { beginAtZero: true, suggestedMax: 10 } } },
    });
    legend("fallbacks", `${t.fallbacks} fallbacks in ${t.requests - t.refused} admitted`);

    chart("chart-cost", {
      type: "bar",
      data: { labels, datasets: [{ label: `cost${a.currency ? ` (${a.currency})` : ""}`,
                                   data: d.cost, backgroundColor: PALETTE[2] }] },
      options: {
        scales: { y: { beginAtZero: true, ticks: { callback: (v, i, ticks) => {
          // As many decimals as the step between ticks needs, at least 2.
          const step = ticks.length > 1 ? Math.abs(ticks[1].value - ticks[0].value) : 0;
          const digits = step > 0 ? Math.min(8, Math.max(2, -Math.floor(Math.log10(step))))
            : 2;
          return fmtCost(v, a.currency, digits);
        } } } },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } },
                   tooltip: { callbacks: { label: (c) => `cost ${money(c.parsed.y)}` } } },
      },
    });
    legend("by_model", pairs(a.by_model, (m) => `${money(m.cost)} (${m.requests} req)`));

    chart("chart-feedback", { type: "bar", data: { labels, datasets: stacked(d.feedback) },
                              options: { scales: stackedScales } });
    const quality = a.feedback.quality_mean === null ? ""
      : ` \u00b7 mean quality ${a.feedback.quality_mean.toFixed(1)}`;
    legend("outcomes", pairs(a.feedback.outcomes, fmtInt) + quality);

    chart("chart-refused", { type: "bar", data: { labels, datasets: stacked(d.refused) },
                             options: { scales: stackedScales } });
    legend("errors_by_code", `refused: ${pairs(a.refused, fmtInt)}; other errors: ` +
      pairs(a.errors_by_code, fmtInt));
    renderScores(a);
  }

  function renderStages(view) {
    const body = $("#stages tbody");
    body.replaceChildren();
    const n = (x) => (x === null || x === undefined ? dash : String(x));
    for (const s of view.stages) {
      const row = document.createElement("tr");
      row.dataset.stage = s.stage;
      cell(row, "stage", s.stage);
      cell(row, "replicas", fmtInt(s.replicas),
           s.replicas === 0 && (s.pending || 0) > 0 ? "breach" : "");
      cell(row, "pending", n(s.pending), (s.pending || 0) > 0 ? "lagging" : "");
      cell(row, "ack_pending", n(s.ack_pending));
      cell(row, "redelivered", n(s.redelivered));
      cell(row, "dead_letters", fmtInt(s.dead_letters), s.dead_letters ? "breach" : "");
      cell(row, "handled", fmtInt(s.handled));
      cell(row, "errors", fmtInt(s.errors), s.errors ? "breach" : "");
      cell(row, "inflight", fmtInt(s.inflight));
      cell(row, "rate", s.rate_per_s === null ? dash : s.rate_per_s.toFixed(1));
      cell(row, "p95", fmtMs(s.p95_ms === null ? s.p95_ms_all : s.p95_ms));
      body.appendChild(row);
    }
    $("#stages-as-of").textContent = `(as of ${fmtTime(view.as_of)})`;
    $("#stages").hidden = false;
  }

  // Served where the gateway has a bus connection (data-stages="1").
  async function loadStages() {
    if (document.body.dataset.stages !== "1") return;
    const response = await fetch("api/stages");
    if (!response.ok) {
      $("#stages-as-of").textContent = `(unavailable: ${response.status}; shown as of ` +
        `the last reading)`;
      return;
    }
    renderStages(await response.json());
  }

  function select(agentId) {
    state.agent = agentId;
    history.replaceState(null, "", "#agent=" + encodeURIComponent(agentId));
    renderAgent();
  }

  // The first load takes the server's default window: the page preloads that URL.
  function fetchFigures(days) {
    return fetch(days ? "api/data?days=" + encodeURIComponent(days) : "api/data");
  }

  function showWindow() {
    const picker = $("#days");
    const n = String(state.data.days.length);
    if (![...picker.options].some((o) => o.value === n)) {
      const option = document.createElement("option");
      option.value = n;
      option.textContent = `${n} days`;
      picker.appendChild(option);
    }
    picker.value = n;
  }

  async function load(pending) {
    document.body.dataset.ready = "0";
    const response = await (pending || fetchFigures($("#days").value));
    if (response.status === 401) { location.reload(); return; }
    if (!response.ok) throw new Error(`${response.status}: ${await response.text()}`);
    state.data = await response.json();
    await chartReady;
    showWindow();
    renderTable();
    renderFreshness();
    const wanted = new URLSearchParams(location.hash.slice(1)).get("agent");
    const ids = state.data.agents.map((a) => a.agent_id);
    state.agent = [state.agent, wanted].find((id) => id && ids.includes(id)) || ids[0] || null;
    renderAgent();
    $("#error").hidden = true;
    state.loads += 1;
    document.body.dataset.loads = String(state.loads);
    document.body.dataset.readyMs = performance.now().toFixed(1);
    document.body.dataset.ready = "1";
  }

  function fail(error) {
    const box = $("#error");
    box.textContent = "Could not load the figures: " + error.message +
      (state.data ? ` (showing those as of ${fmtTime(state.data.as_of)})` : "");
    box.hidden = false;
    document.body.dataset.ready = "error";
  }

  // Read again while visible; a hidden page costs the database nothing and catches up
  // when shown.
  function refresh() {
    if (document.hidden) return;
    load().catch(fail);
    loadStages().catch(() => {});
  }

  function schedule() {
    const seconds = Number(document.body.dataset.refreshS || 0);
    if (seconds > 0) state.timer = setInterval(refresh, seconds * 1000);
  }

  // This script runs before Chart.js is evaluated, so the figures are on their way
  // while it parses; drawing waits for both.
  const chartReady = new Promise((resolve) => {
    if (typeof Chart !== "undefined") resolve();
    else document.addEventListener("DOMContentLoaded", () => resolve());
  });
  const first = fetchFigures(null);
  $("#days").addEventListener("change", () => load().catch(fail));
  $("#agent-select").addEventListener("change", (e) => select(e.target.value));
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  load(first).catch(fail).finally(schedule);
  loadStages().catch(() => {});
})();
