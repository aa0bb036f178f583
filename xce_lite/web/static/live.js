// Keeps a page live without a reload: every few seconds it asks the same address for its <main>
// block alone (the server answers `X-Xce-Live: 1` with that fragment) and swaps it in when it
// changed. Filters and other controls live outside <main>, so what one types is never replaced.
"use strict";
(function () {
  const main = document.getElementById("live");
  const badge = document.getElementById("live-status");
  if (!main) return;
  const period = Math.max(1, Number(main.dataset.refresh || 3)) * 1000;
  let last = main.innerHTML;
  let timer = null;

  function mark(state, title) {
    if (!badge) return;
    badge.dataset.state = state;
    badge.textContent = state;
    if (title) badge.title = title;
  }

  async function poll() {
    timer = null;
    if (document.hidden) return schedule();
    try {
      const reply = await fetch(location.href, {headers: {"X-Xce-Live": "1"}, cache: "no-store",
                                                credentials: "same-origin"});
      if (reply.headers.get("X-Xce-Fragment") === "1") {
        const html = await reply.text();
        if (html !== last) {
          const tail = document.getElementById("tail");
          const atEnd = tail && tail.scrollTop + tail.clientHeight >= tail.scrollHeight - 4;
          main.innerHTML = html;
          last = html;
          const fresh = document.getElementById("tail");
          if (fresh && (atEnd || !tail)) fresh.scrollTop = fresh.scrollHeight;
          document.dispatchEvent(new CustomEvent("xce:updated"));
        }
        mark(reply.ok ? "live" : "error", reply.ok ? "" : "the controller did not answer; trying again");
      } else {
        mark("stale", "the dashboard answered " + reply.status + "; reload the page");
      }
    } catch (err) {
      mark("offline", "the dashboard does not answer (" + err + "); trying again");
    }
    schedule();
  }

  function schedule() {
    if (timer === null) timer = setTimeout(poll, period);
  }

  document.addEventListener("visibilitychange", () => { if (!document.hidden) { clearTimeout(timer); timer = null; poll(); } });
  const tail = document.getElementById("tail");
  if (tail) tail.scrollTop = tail.scrollHeight;
  schedule();
})();
