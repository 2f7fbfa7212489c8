// rover's dashboard: the Now page's live part (server-sent events from /live) and the elapsed
// times ticking. The HTML it inserts is the server's, escaped there; nothing else is evaluated.
"use strict";

function tick() {
  const now = Date.now();
  for (const cell of document.querySelectorAll("[data-since]")) {
    const since = Date.parse(cell.getAttribute("data-since"));
    if (Number.isNaN(since)) continue;
    const s = Math.max(0, Math.floor((now - since) / 1000));
    cell.textContent = s < 60 ? s + "s" : s < 3600 ? Math.floor(s / 60) + "m " + String(s % 60).padStart(2, "0") + "s"
      : Math.floor(s / 3600) + "h " + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
  }
}

function live() {
  const part = document.getElementById("now");
  if (!part || !window.EventSource) return;
  const source = new EventSource(part.getAttribute("data-live"));
  source.addEventListener("now", (e) => {
    part.innerHTML = e.data;
    part.setAttribute("data-updates", String(Number(part.getAttribute("data-updates") || "0") + 1));
    tick();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  live();
  tick();
  setInterval(tick, 1000);
});
