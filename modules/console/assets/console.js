// lchat console: live updates over server-sent events. The page works without this
// script; with it, events appear as they happen and the tables and charts refresh.
(function () {
  "use strict";
  var base = document.body.dataset.base || "./";
  var live = document.getElementById("live");
  var list = document.getElementById("event-list");
  var index = !!document.getElementById("spaces-fragment");
  var maxShown = 200;
  var timer = null, pending = {};

  function setLive(on) {
    if (!live) return;
    live.textContent = on ? "live" : "reconnecting…";
    live.className = "live " + (on ? "on" : "off");
  }

  function ms(d) { return Math.round(d / 1e6) + " ms"; }
  function host(self) { try { return new URL(self).host; } catch (e) { return self; } }

  function text(ev) {
    var s = ev.host || "";
    if (ev.box) s += (s ? " on " : "") + host(ev.box);
    if (ev.phases) {
      var p = ev.phases, total = p.lease + p.restore + (p.fence || 0) + p.start + p.ready;
      s += " in " + ms(total) + " (lease " + ms(p.lease) + ", restore " + ms(p.restore) + ", fence " + ms(p.fence || 0) +
        ", start " + ms(p.start) + ", ready " + ms(p.ready) + ")";
    }
    if (ev.detail) s += (s ? ": " : "") + ev.detail;
    if (ev.error) s += " — failed: " + ev.error;
    return s;
  }

  function addEvent(ev) {
    if (!list) return;
    var empty = list.querySelector(".empty");
    if (empty) empty.remove();
    var li = document.createElement("li");
    li.className = "ev new ev-" + ev.type;
    var t = document.createElement("time");
    var at = new Date(ev.at);
    t.dateTime = ev.at;
    t.textContent = at.toLocaleTimeString([], { hour12: false });
    var ty = document.createElement("span");
    ty.className = "etype";
    ty.textContent = ev.type;
    var tx = document.createElement("span");
    tx.className = "etext";
    tx.textContent = text(ev);
    li.append(t, " ", ty, " ", tx);
    list.prepend(li);
    while (list.children.length > maxShown) list.lastElementChild.remove();
    list.dataset.last = ev.seq;
  }

  function refresh(names) {
    names.forEach(function (n) { pending[n] = true; });
    if (timer) return;
    timer = setTimeout(function () {
      timer = null;
      var todo = Object.keys(pending);
      pending = {};
      todo.forEach(load);
    }, 250);
  }

  function load(name) {
    var el = document.getElementById(name + "-fragment");
    if (!el) return;
    var q = document.getElementById("q");
    var url = base + "fragment/" + name + (q && q.value ? "?q=" + encodeURIComponent(q.value) : "");
    fetch(url, { credentials: "same-origin", cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error(r.status);
      return r.text();
    }).then(function (html) {
      // Keep keyboard focus where it was when the table under it is replaced.
      var active = document.activeElement, key = null;
      if (active && el.contains(active) && active.getAttribute("href")) key = active.getAttribute("href");
      var before = {};
      el.querySelectorAll("tr[data-host]").forEach(function (tr) { before[tr.dataset.host] = tr.textContent; });
      el.innerHTML = html;
      el.querySelectorAll("tr[data-host]").forEach(function (tr) {
        if (before[tr.dataset.host] !== undefined && before[tr.dataset.host] !== tr.textContent) tr.classList.add("flash");
      });
      if (key) { var again = el.querySelector('[href="' + CSS.escape(key) + '"]'); if (again) again.focus(); }
    }).catch(function () { /* the next event or tick tries again */ });
  }

  if (!window.EventSource) return;
  var after = list ? list.dataset.last : "";
  var es = null;
  function openStream() {
    es = new EventSource(base + "events" + (after && after !== "0" ? "?after=" + after : ""));
    es.onopen = function () { setLive(true); };
    es.onerror = function () { setLive(false); };
    es.onmessage = function (m) {
      var ev;
      try { ev = JSON.parse(m.data); } catch (e) { return; }
      if (m.lastEventId) after = m.lastEventId;
      addEvent(ev);
      if (!index) return;
      var names = ["spaces", "fleet"];
      if (["wake", "sleep", "crash", "fence", "derp_switch"].indexOf(ev.type) >= 0) names.push("charts");
      refresh(names);
    };
  }
  openStream();
  // A page the browser keeps in its back/forward cache would keep its stream open, and a
  // browser gives one HTTP/1.1 host six connections: after six pages the console's next
  // request would wait forever. Close the stream when the page is hidden; reopen it,
  // from the last event seen, when the page comes back.
  window.addEventListener("pagehide", function () { if (es) { es.close(); es = null; } setLive(false); });
  window.addEventListener("pageshow", function (e) { if (e.persisted && !es) openStream(); });
  // Heartbeat ages and boxes joining or leaving show within 5 s even when no event comes.
  // A provider's health changes with no event either.
  if (index) setInterval(function () { refresh(["fleet", "charts", "providers"]); }, 5000);
})();
