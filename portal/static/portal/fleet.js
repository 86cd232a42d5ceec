// The live fleet view: one websocket to /ws/fleet/, a whole snapshot a second, rendered into
// the page's tables. Reconnects by itself with backoff; a refusal (4403) stops it.
// Whenever the figures stop being live — the socket is down, no update came for a while, or
// the server says it cannot reach Valkey ({"status": "unavailable"}) — the tables are marked
// stale and a notice says since when and why; the next newer snapshot makes them live again.
"use strict";

(function () {
  var FORBIDDEN = 4403;
  var STALE_MS = 3000; // a second's updates missed three times over: say so
  var statusEl, updatedEl, policyEl, ratesBody, classesBody, modelsEl, emptyEl, noticeEl, dataEl;
  var socket = null;
  var attempt = 0;
  var lastMessageAt = 0;
  var lastAt = 0; // at_ms of the snapshot on the page: an older or the same one is not news
  var layerDown = false;
  var refused = false;

  function el(tag, text, className) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function num(value, digits) {
    if (value === null || value === undefined) return "—";
    return Number(value).toLocaleString("en", { maximumFractionDigits: digits || 0 });
  }

  function percent(value) {
    return value === null || value === undefined ? "—" : (value * 100).toFixed(1) + " %";
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "—";
    return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(1) + " s";
  }

  function row(cells) {
    var tr = document.createElement("tr");
    cells.forEach(function (cell) { tr.appendChild(cell); });
    return tr;
  }

  function th(text) {
    var cell = el("th", text);
    cell.scope = "row";
    return cell;
  }

  // ``field`` names the snapshot's value the cell shows (data-field): for tests and styles.
  function td(text, field) {
    var cell = el("td", text, "num");
    cell.dataset.field = field;
    return cell;
  }

  function state(text, kind) {
    var cell = document.createElement("td");
    cell.dataset.field = "state";
    cell.appendChild(el("span", text, "status status-" + kind));
    return cell;
  }

  function rateRow(name, rates, isTotal) {
    var first = th(name);
    var tr = row([
      first,
      td(num(rates.admitted, 2), "admitted"), td(num(rates.queued, 2), "queued"),
      td(num(rates.shed, 2), "shed"), td(num(rates.refused, 2), "refused"),
      td(num(rates.fallbacks, 2), "fallbacks"),
      td(num(rates.prompt_tokens, 1), "prompt_tokens"),
      td(num(rates.completion_tokens, 1), "completion_tokens"),
      td(num(rates.tokens, 1), "tokens")
    ]);
    tr.dataset.model = isTotal ? "" : name;
    if (isTotal) tr.className = "fleet-total";
    return tr;
  }

  function table(caption, heads, rows) {
    var wrap = el("div", null, "scroll-x");
    var t = document.createElement("table");
    t.appendChild(el("caption", caption));
    var thead = document.createElement("thead");
    var tr = document.createElement("tr");
    heads.forEach(function (h) {
      var cell = el("th", h[0], h[1] ? "num" : "");
      cell.scope = "col";
      tr.appendChild(cell);
    });
    thead.appendChild(tr);
    t.appendChild(thead);
    var body = document.createElement("tbody");
    rows.forEach(function (r) { body.appendChild(r); });
    t.appendChild(body);
    wrap.appendChild(t);
    return wrap;
  }

  function classRow(c) {
    var tr = row([
      th(c.priority_class), td(c.rank, "rank"), td(num(c.depth), "depth"),
      td(duration(c.oldest_wait_ms), "oldest_wait_ms"),
      td(c.in_flight === null ? "—" : num(c.in_flight), "in_flight")
    ]);
    tr.dataset.priorityClass = c.priority_class;
    return tr;
  }

  function modelSection(model, index) {
    var section = el("section", null, "fleet-model");
    section.dataset.model = model.model;
    var heading = el("h2", model.model);
    heading.id = "fleet-model-" + index;
    section.setAttribute("aria-labelledby", heading.id);
    section.appendChild(heading);
    section.appendChild(el("p",
      "In the queue: " + model.queued + " · leases held: " + model.leases, "muted"));
    var replicas = model.replicas.map(function (r) {
      var tr = row([
        th(r.replica),
        td(num(r.running), "running"), td(num(r.waiting), "waiting"),
        td(percent(r.kv_usage), "kv_usage"), td(num(r.in_flight), "in_flight"),
        td(r.cap === null ? "—" : num(r.cap), "cap"),
        !r.reachable ? state(r.age_ms === null ? "no metrics" : "unreachable", "revoked")
          : r.saturated ? state("saturated", "pending")
          : r.full ? state("full", "pending") : state("has room", "active"),
        td(duration(r.age_ms), "age_ms")
      ]);
      tr.dataset.replica = r.replica;
      return tr;
    });
    section.appendChild(table("Replicas", [
      ["Replica"], ["Running", 1], ["Waiting (vLLM)", 1], ["KV cache", 1], ["In flight", 1],
      ["Cap", 1], ["State"], ["Metrics age", 1]
    ], replicas));
    var classes = model.classes.map(classRow);
    section.appendChild(table("Priority classes", [
      ["Class"], ["Rank", 1], ["Queue depth", 1], ["Oldest wait", 1], ["In flight (pool share)", 1]
    ], classes));
    return section;
  }

  function render(snapshot) {
    var rates = [rateRow("All models", snapshot.rates, true)];
    Object.keys(snapshot.per_model).forEach(function (name) {
      rates.push(rateRow(name, snapshot.per_model[name], false));
    });
    ratesBody.replaceChildren.apply(ratesBody, rates);
    classesBody.replaceChildren.apply(classesBody, snapshot.classes.map(classRow));
    modelsEl.replaceChildren.apply(modelsEl, snapshot.models.map(modelSection));
    emptyEl.hidden = snapshot.models.length > 0;
    var at = new Date(snapshot.at_ms);
    updatedEl.dateTime = at.toISOString();
    updatedEl.textContent = at.toISOString().slice(11, 19) + " UTC";
    policyEl.textContent = snapshot.policy_version === null ? "—" : snapshot.policy_version;
  }

  function show(stateName, text, kind) {
    statusEl.dataset.state = stateName;
    statusEl.textContent = text;
    statusEl.className = "status status-" + kind;
  }

  // The figures on the page are not live: say so, and why, once per change of state.
  function stale(stateName, text, kind, reason) {
    if (statusEl.dataset.state === stateName) return;
    show(stateName, text, kind);
    dataEl.dataset.stale = "true";
    var since = lastAt ? " The figures below are from " + updatedEl.textContent + " and are not live." : "";
    noticeEl.textContent = reason + since;
    noticeEl.hidden = false;
  }

  function fresh() {
    show("live", "live", "active");
    dataEl.dataset.stale = "false";
    noticeEl.hidden = true;
    noticeEl.textContent = "";
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + "/ws/fleet/");
    // Open but silent for long (no publisher, or one that stopped): "stale", not "live".
    socket.onopen = function () { attempt = 0; lastMessageAt = Date.now(); };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.status === "unavailable") {
        layerDown = true;
        stale("unavailable", "unavailable", "revoked",
          "Live data is unavailable: " + message.detail + " This page updates by itself when it is back.");
        return;
      }
      if (message.status === "available") {
        layerDown = false;
        lastMessageAt = Date.now();
        stale("resuming", "resuming", "pending", "Valkey is reachable again: waiting for the next update.");
        return;
      }
      if (message.at_ms <= lastAt) return; // the picture already shown, kept over an outage
      lastAt = message.at_ms;
      lastMessageAt = Date.now();
      render(message);
      fresh();
    };
    socket.onclose = function (event) {
      socket = null;
      if (event.code === FORBIDDEN) {
        refused = true;
        stale("refused", "not allowed", "revoked", "You may no longer watch the fleet.");
        return;
      }
      // Backoff: 0.5 s doubling to 10 s, with jitter, so that pages do not return at once.
      var delay = Math.min(10000, 500 * Math.pow(2, attempt)) * (0.75 + Math.random() / 2);
      attempt += 1;
      layerDown = false;
      stale("reconnecting", "reconnecting", "pending", "The connection to the portal is lost; reconnecting.");
      setTimeout(connect, delay);
    };
  }

  function watchStaleness() {
    setInterval(function () {
      if (refused || layerDown || !socket || socket.readyState !== WebSocket.OPEN) return;
      if (Date.now() - lastMessageAt > STALE_MS) {
        stale("stale", "stale", "pending", "No update for a few seconds: the fleet publisher is not publishing.");
      }
    }, 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    statusEl = document.getElementById("fleet-status");
    updatedEl = document.getElementById("fleet-updated");
    policyEl = document.getElementById("fleet-policy");
    ratesBody = document.querySelector("#fleet-rates tbody");
    classesBody = document.querySelector("#fleet-classes tbody");
    modelsEl = document.getElementById("fleet-models");
    emptyEl = document.getElementById("fleet-empty");
    noticeEl = document.getElementById("fleet-notice");
    dataEl = document.getElementById("fleet-data");
    var initial = JSON.parse(document.getElementById("fleet-initial").textContent);
    if (initial) {
      render(initial);
      lastAt = initial.at_ms;
    }
    connect();
    watchStaleness();
  });
})();
