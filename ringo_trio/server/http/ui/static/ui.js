// The dashboard's only script: live parts and confirmations. No build step.
//
// Live parts: every element with data-fragment="NAME" is refreshed from
// the same URL with ?fragment=NAME once a second while the tab is visible,
// one request in flight at a time (the next waits for the last to end).
"use strict";

(function () {
  const PERIOD_MS = 1000;

  function fragmentUrl(name) {
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", name);
    return url.toString();
  }

  async function refresh(element) {
    const response = await fetch(fragmentUrl(element.dataset.fragment), {
      credentials: "same-origin",
      headers: { "Accept": "text/html" },
    });
    if (response.status === 401) {
      // The session ran out: the page itself leads to the login form.
      window.location.reload();
      return;
    }
    if (response.ok) {
      element.innerHTML = await response.text();
    }
  }

  let inFlight = false;

  async function tick() {
    if (inFlight || document.visibilityState !== "visible") {
      return;
    }
    const parts = document.querySelectorAll("[data-fragment]");
    if (parts.length === 0) {
      return;
    }
    inFlight = true;
    try {
      for (const part of parts) {
        await refresh(part);
      }
    } catch (error) {
      // The daemon may be restarting; the next tick tries again.
    } finally {
      inFlight = false;
    }
  }

  function start() {
    window.setInterval(tick, PERIOD_MS);
    document.addEventListener("visibilitychange", tick);
  }

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm) {
      if (!window.confirm(form.dataset.confirm)) {
        event.preventDefault();
      }
    }
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
