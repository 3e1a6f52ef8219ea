// The dashboard page: fetches api/data (the same figures as JSON) and renders the
// all-agents table, the selected agent's figures and its charts (Chart.js, vendored).
// Text goes into the DOM with textContent only: agent ids are never markup.
"use strict";

(function () {
  const PALETTE = ["#3366cc", "#dc7633", "#2e9e5b", "#8e44ad", "#c0392b", "#17a2b8",
                   "#7f8c8d", "#d4ac0d"];
  const BREACH = "#c0392b";
  const state = { data: null, agent: null, charts: [] };

  const $ = (selector) => document.querySelector(selector);
  const dash = "\u2013";
  const fmtInt = (n) => String(n);
  const fmtCost = (x) => x.toFixed(4);
  const fmtRate = (r) => (r === null ? dash : (r * 100).toFixed(1) + " %");
  const fmtMs = (x) => (x === null || x === undefined ? dash : x.toFixed(0));
  const label = (key) => (key === "" ? "(none)" : key);

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

  function renderTable() {
    const body = $("#agents tbody");
    body.replaceChildren();
    for (const a of state.data.agents) {
      const t = a.totals;
      const row = document.createElement("tr");
      row.dataset.agent = a.agent_id;
      cell(row, "agent_id", a.agent_id);
      cell(row, "requests", fmtInt(t.requests));
      cell(row, "errors", fmtInt(t.errors));
      cell(row, "fallback_rate", fmtRate(t.fallback_rate));
      cell(row, "cost", fmtCost(t.cost));
      cell(row, "p50", fmtMs(t.p50_ms));
      cell(row, "p95", fmtMs(t.p95_ms));
      cell(row, "slo", fmtMs(a.slo_p95_ms));
      cell(row, "slo_breaches", fmtInt(a.slo_breaches), a.slo_breaches ? "breach" : "");
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

  function chart(id, config) {
    config.options = Object.assign({
      animation: false, responsive: true, maintainAspectRatio: false,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
    }, config.options || {});
    state.charts.push(new Chart(document.getElementById(id), config));
  }

  function stacked(series) {
    return Object.entries(series).map(([key, values], i) => ({
      label: label(key), data: values, backgroundColor: PALETTE[i % PALETTE.length],
    }));
  }

  const stackedScales = { x: { stacked: true }, y: { stacked: true, beginAtZero: true } };
  const pairs = (obj, fmt) => Object.entries(obj)
    .map(([key, value]) => `${label(key)} ${fmt(value)}`).join(" \u00b7 ") || dash;

  function renderAgent() {
    const a = state.data.agents.find((x) => x.agent_id === state.agent);
    $("#agent").hidden = !a;
    for (const c of state.charts) c.destroy();
    state.charts = [];
    if (!a) return;
    $("#agent-select").value = a.agent_id;
    for (const row of document.querySelectorAll("#agents tbody tr")) {
      row.classList.toggle("selected", row.dataset.agent === a.agent_id);
    }
    const t = a.totals;
    const tile = (field, text) => { $(`#tiles [data-field="${field}"]`).textContent = text; };
    tile("requests", fmtInt(t.requests));
    tile("errors", fmtInt(t.errors));
    tile("fallback_rate", fmtRate(t.fallback_rate));
    tile("cost", fmtCost(t.cost));
    tile("tokens", `${t.tokens_in} / ${t.tokens_out}`);
    tile("p95", `${fmtMs(t.p95_ms)} (${a.slo_p95_ms === null ? "no SLO" : fmtMs(a.slo_p95_ms)})`);
    tile("slo_breaches", fmtInt(a.slo_breaches));
    tile("feedback", feedbackText(a.feedback));

    const d = a.daily;
    const labels = state.data.days.map((day) => day.slice(5));
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
    const breached = state.data.days.filter((_, i) => d.breach[i]);
    legend("breach_days", a.slo_p95_ms === null ? "No SLO set"
      : breached.length ? `Breached on ${breached.join(", ")}` : "No breach");

    chart("chart-fallback", {
      type: "line",
      data: { labels, datasets: [{ label: "fallback %", borderColor: PALETTE[3],
        data: d.fallback_rate.map((r) => (r === null ? null : r * 100)) }] },
      options: { scales: { y: { beginAtZero: true, suggestedMax: 10 } } },
    });
    legend("fallbacks", `${t.fallbacks} fallbacks in ${t.requests} requests`);

    chart("chart-cost", { type: "bar", data: { labels, datasets: [
      { label: "cost", data: d.cost, backgroundColor: PALETTE[2] }] },
      options: { scales: { y: { beginAtZero: true } } } });
    legend("by_model", pairs(a.by_model, (m) => `${fmtCost(m.cost)} (${m.requests} req)`));

    chart("chart-feedback", { type: "bar", data: { labels, datasets: stacked(d.feedback) },
                              options: { scales: stackedScales } });
    const quality = a.feedback.quality_mean === null ? ""
      : ` \u00b7 mean quality ${a.feedback.quality_mean.toFixed(1)}`;
    legend("outcomes", pairs(a.feedback.outcomes, fmtInt) + quality);
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
    const wanted = new URLSearchParams(location.hash.slice(1)).get("agent");
    const ids = state.data.agents.map((a) => a.agent_id);
    state.agent = [wanted, state.agent].find((id) => id && ids.includes(id)) || ids[0] || null;
    renderAgent();
    document.body.dataset.readyMs = performance.now().toFixed(1);
    document.body.dataset.ready = "1";
  }

  function fail(error) {
    const box = $("#error");
    box.textContent = "Could not load the figures: " + error.message;
    box.hidden = false;
    document.body.dataset.ready = "error";
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
  load(first).catch(fail);
})();
