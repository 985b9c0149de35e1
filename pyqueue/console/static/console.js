// Live updates of the overview: an EventSource on the console's /events stream; each "refresh"
// event makes htmx fetch the table again. The button closes and reopens the stream.
(function () {
  "use strict";
  function start() {
    var live = document.getElementById("live");
    var toggle = document.getElementById("live-toggle");
    var status = document.getElementById("live-status");
    if (!live || !toggle || !status || typeof EventSource === "undefined") {
      return;
    }
    var source = null;
    function connect() {
      source = new EventSource(live.getAttribute("data-events"));
      source.addEventListener("refresh", function () {
        window.htmx.trigger(live, "refresh");
      });
      source.onerror = function () {
        status.textContent = "reconnecting";
      };
      source.onopen = function () {
        status.textContent = "live";
      };
    }
    toggle.addEventListener("click", function () {
      if (source) {
        source.close();
        source = null;
        status.textContent = "paused";
        toggle.textContent = "Resume live updates";
      } else {
        connect();
        window.htmx.trigger(live, "refresh");
        status.textContent = "live";
        toggle.textContent = "Pause live updates";
      }
    });
    window.addEventListener("pagehide", function () {
      if (source) {
        source.close();
      }
    });
    connect();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
