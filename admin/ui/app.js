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

// The tenant lookup: one tenant's use of each limit that counts by what the form says, read
// from the admin usage API (GET /usage/orgs|projects|ips/{id}) or, for a key digest, from
// each key limit's kept windows (GET /usage/history). Built with DOM calls only: nothing the
// answers hold is ever parsed as HTML.
(function () {
  var form = document.getElementById("lookup");
  var out = document.getElementById("lookup-result");
  if (!form || !out) {
    return;
  }
  var paths = { org: "/usage/orgs/", project: "/usage/projects/", ip: "/usage/ips/" };

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) {
      e.textContent = String(text);
    }
    if (cls) {
      e.className = cls;
    }
    return e;
  }
  function thousands(n) {
    return Number(n).toLocaleString("en-US");
  }
  // As the page's own: one decimal, "<0.1%" for a use under 0.1% that is not none.
  function percentText(pct) {
    if (pct > 0 && pct < 0.1) {
      return "<0.1%";
    }
    return pct.toFixed(1) + "%";
  }
  function ago(iso) {
    var d = (Date.parse(iso) - Date.now()) / 1000;
    var prefix = "in ", suffix = "";
    if (d < 0) {
      d = -d;
      prefix = "";
      suffix = " ago";
    }
    var v;
    if (d < 60) {
      v = Math.floor(d) + " s";
    } else if (d < 3600) {
      v = Math.floor(d / 60) + " min";
    } else if (d < 48 * 3600) {
      v = Math.floor(d / 3600) + " h";
    } else {
      v = Math.floor(d / 86400) + " days";
    }
    return prefix + v + suffix;
  }
  function modeOf(limit) {
    var s = document.querySelector('section.limit[data-limit="' + CSS.escape(limit) + '"]');
    return s ? s.getAttribute("data-mode") : "";
  }
  function get(url) {
    return fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (res) {
        return res.json().then(
          function (body) {
            return { ok: res.ok, status: res.status, body: body };
          },
          function () {
            return { ok: false, status: res.status, body: {} };
          }
        );
      });
  }
  function failure(r) {
    return (r.body && r.body.error) || "HTTP " + r.status;
  }

  // rows: {name, unit, used, limit, reserved, reset, error}
  function show(by, id, rows, error) {
    out.textContent = "";
    var cap = el("p", null, "lookup-title");
    cap.appendChild(document.createTextNode(by + " "));
    cap.appendChild(el("code", id));
    out.appendChild(cap);
    if (error) {
      out.appendChild(el("p", error, "error"));
      return;
    }
    if (rows.length === 0) {
      out.appendChild(el("p", "No enabled limit counts by " + by + ".", "muted"));
      return;
    }
    var table = el("table", null, "lookup-table");
    var head = el("tr");
    ["Name", "Used", "Limit", "Usage", "Resets"].forEach(function (h, i) {
      var th = el("th", h, i === 1 || i === 2 ? "num" : "");
      th.scope = "col";
      head.appendChild(th);
    });
    table.appendChild(el("thead")).appendChild(head);
    var body = el("tbody");
    rows.forEach(function (r) {
      var tr = el("tr");
      tr.setAttribute("data-limit", r.name);
      var name = el("td");
      name.appendChild(el("span", r.name));
      var mode = modeOf(r.name);
      if (mode === "shadow") {
        name.appendChild(document.createTextNode(" "));
        name.appendChild(el("span", "shadow", "mark shadow"));
      }
      tr.appendChild(name);
      if (r.error) {
        var td = el("td", r.error, "muted");
        td.colSpan = 4;
        tr.appendChild(td);
        body.appendChild(tr);
        return;
      }
      var used = el("td", thousands(r.used), "num used");
      if (r.reserved) {
        used.appendChild(document.createTextNode(" "));
        used.appendChild(el("span", "+" + thousands(r.reserved) + " reserved", "reserved"));
      }
      tr.appendChild(used);
      tr.appendChild(el("td", thousands(r.limit) + " " + r.unit, "num limit"));
      var pct = r.limit > 0 ? (r.used / r.limit) * 100 : 100;
      var usage = el("td", null, "usage");
      var bar = el("progress");
      bar.max = 100;
      bar.value = Math.min(pct, 100);
      usage.appendChild(bar);
      usage.appendChild(el("span", percentText(pct), "pct"));
      tr.appendChild(usage);
      tr.appendChild(el("td", r.unit === "streams" ? "in flight" : ago(r.reset)));
      body.appendChild(tr);
    });
    table.appendChild(body);
    out.appendChild(table);
  }

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var by = form.elements.by.value;
    var id = form.elements.id.value.trim();
    if (id === "") {
      return;
    }
    out.textContent = "Reading…";
    if (by !== "key") {
      get(paths[by] + encodeURIComponent(id))
        .then(function (r) {
          if (!r.ok) {
            show(by, id, [], failure(r));
            return;
          }
          show(by, id, (r.body.limits || []).map(function (u) {
            return { name: u.name, unit: u.unit, used: u.used, limit: u.limit, reserved: u.reserved, reset: u.reset };
          }));
        })
        .catch(function (e) {
          show(by, id, [], "The usage API could not be reached: " + e.message);
        });
      return;
    }
    var names = (form.getAttribute("data-key-limits") || "").split(" ").filter(Boolean);
    Promise.all(names.map(function (name) {
      return get("/usage/history?" + new URLSearchParams({ limit: name, id: id }).toString()).then(function (r) {
        if (!r.ok) {
          return { name: name, error: failure(r) };
        }
        var w = (r.body.windows || [])[0];
        if (!w) {
          return { name: name, error: "no kept window" };
        }
        // The allowance in force (limit or override, plus grants), as /usage shows it.
        var limit = w.allowance === undefined ? w.limit : w.allowance;
        return { name: name, unit: r.body.unit, used: w.used, limit: limit, reset: w.end };
      });
    }))
      .then(function (rows) {
        show("key digest", id, rows);
      })
      .catch(function (e) {
        show("key digest", id, [], "The usage API could not be reached: " + e.message);
      });
  });
})();
