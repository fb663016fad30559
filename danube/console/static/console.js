// Live refresh: every element marked data-live is re-rendered by the server every 2 s
// (the same URL with ?live=1 answers the fragment alone) and swapped in place. Paused while
// the tab is hidden or while a field inside the fragment is being typed in.
(function () {
  "use strict";
  var PERIOD_MS = 2000;
  var status = document.getElementById("live-status");
  var regions = document.querySelectorAll("[data-live]");

  function mark(text, failed) {
    if (!status) return;
    status.textContent = text;
    status.className = failed ? "failed" : "ok";
  }

  function liveUrl() {
    var url = new URL(window.location.href);
    url.searchParams.delete("notice");
    url.searchParams.set("live", "1");
    return url.toString();
  }

  function formatTimes(root) {
    root.querySelectorAll(".ts[data-epoch]").forEach(function (el) {
      var n = Number(el.dataset.epoch);
      if (!n) return;
      var ms = n > 1e12 ? n : n * 1000;
      el.textContent = new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
    });
  }

  var busy = false;
  function refresh() {
    if (busy || document.hidden || !regions.length) return;
    var focused = document.activeElement;
    var typing = focused && /^(INPUT|SELECT|TEXTAREA)$/.test(focused.tagName);
    for (var i = 0; i < regions.length; i++) {
      if (typing && regions[i].contains(focused)) return;
    }
    busy = true;
    fetch(liveUrl(), { cache: "no-store", headers: { "Accept": "text/html" } })
      .then(function (response) {
        return response.text().then(function (body) {
          if (!response.ok) {
            var doc = new DOMParser().parseFromString(body, "text/html");
            var err = doc.querySelector(".error");
            throw new Error((err ? err.textContent : "") || ("HTTP " + response.status));
          }
          return body;
        });
      })
      .then(function (html) {
        regions[0].innerHTML = html;
        formatTimes(regions[0]);
        mark("live · updated " + new Date().toLocaleTimeString(), false);
      })
      .catch(function (err) {
        mark("live refresh failed: " + err.message, true);
      })
      .finally(function () { busy = false; });
  }

  // A form that asks first (unsubscribe): data-confirm holds the question.
  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  formatTimes(document);
  if (regions.length) {
    mark("live", false);
    window.setInterval(refresh, PERIOD_MS);
    document.addEventListener("visibilitychange", refresh);
  }
})();
