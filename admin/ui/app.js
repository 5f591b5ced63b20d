// Refreshes the usage page's content every data-refresh seconds: it fetches the content
// alone (?partial=1) and swaps it in, so the page never reloads or flashes. The browser sends
// the same credentials it used for the page. A failed refresh keeps the last content.
"use strict";
(function () {
  var seconds = parseInt(document.body.getAttribute("data-refresh"), 10);
  if (!(seconds > 0)) {
    return;
  }
  var content = document.getElementById("content");
  function refresh() {
    fetch(window.location.pathname + "?partial=1", { credentials: "same-origin", cache: "no-store" })
      .then(function (res) {
        if (!res.ok) {
          throw new Error("HTTP " + res.status);
        }
        return res.text();
      })
      .then(function (html) {
        content.innerHTML = html;
      })
      .catch(function () {
        content.setAttribute("data-stale", "true");
      })
      .finally(function () {
        window.setTimeout(refresh, seconds * 1000);
      });
  }
  window.setTimeout(refresh, seconds * 1000);
})();
