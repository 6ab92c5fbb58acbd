/* Switchboard operator board: live regions over Server-Sent Events, confirmations, copy buttons.
 *
 * A page with `[data-live-src]` opens `/api/v1/stream`. After `todo` events (debounced 150 ms)
 * it fetches `data-live-src` with the header `X-Board-Partial: 1`; the answer holds one
 * `[data-live-part=NAME]` element per live region of the page, whose content replaces the
 * region's. On a todo page (`data-live-todo`) only that todo's events count. While the operator
 * is editing a form inside a live region (focus in a field, or a field changed from what the
 * server sent), the refresh waits, and a refresh that arrives once editing began is not applied.
 *
 * The stream starts at the present when it opens, not when the page was rendered: whatever
 * committed in between would never come as an event. So each time the stream opens (and each
 * time it reconnects) the page refreshes once to catch up. A region whose server HTML did not
 * change is left as it is; what such a catch-up brings flashes (the rows that are new, or a todo
 * page's regions), nothing else does. A region holding a form the server filled back in after a
 * refused action (`data-refilled`) counts as being edited.
 */
(function () {
  "use strict";

  var DEBOUNCE_MS = 150;
  var BUSY_RETRY_MS = 1000;

  function setStatus(text, live) {
    document.querySelectorAll("[data-live-status]").forEach(function (el) {
      el.textContent = text;
      el.classList.toggle("is-live", !!live);
    });
  }

  function isBusy(region) {
    if (region.querySelector("[data-refilled]")) {
      return true; // the operator's refused input, shown again: never replaced under them
    }
    var active = document.activeElement;
    if (active && region.contains(active) && active.matches("input, textarea, select")) {
      return true;
    }
    var fields = region.querySelectorAll("input:not([type=hidden]), textarea");
    for (var i = 0; i < fields.length; i++) {
      var field = fields[i];
      var dirty = field.type === "checkbox" || field.type === "radio"
        ? field.checked !== field.defaultChecked : field.value !== field.defaultValue;
      if (dirty) {
        return true;
      }
    }
    var selects = region.querySelectorAll("select");
    for (var j = 0; j < selects.length; j++) {
      var select = selects[j];
      if (select.multiple) {
        if (Array.prototype.some.call(select.options, function (o) { return o.selected !== o.defaultSelected; })) {
          return true;
        }
        continue;
      }
      var preset = Array.prototype.findIndex.call(select.options, function (option) { return option.defaultSelected; });
      if (select.selectedIndex !== Math.max(preset, 0)) { // none marked `selected`: the first shows
        return true;
      }
    }
    return false;
  }

  function markUpdated(root, ids) {
    ids.forEach(function (id) {
      root.querySelectorAll('[data-todo-id="' + CSS.escape(id) + '"]').forEach(function (el) {
        el.classList.remove("is-updated");
        void el.offsetWidth; // restart the animation
        el.classList.add("is-updated");
      });
    });
  }

  function startLive(root) {
    var src = root.getAttribute("data-live-src");
    var onlyTodo = root.getAttribute("data-live-todo");
    var regions = Array.prototype.slice.call(root.querySelectorAll("[data-live-part]"));
    if (!src || !regions.length || !window.EventSource || !window.fetch) {
      return;
    }
    var timer = null;
    var inFlight = false;
    var again = false;
    var touched = new Set();
    var catchUp = false; // the next refresh is the stream's catch-up, not an event's
    // each region's HTML as the server sent it (trimmed: the page and the partial indent it apart)
    var shown = regions.map(function (region) { return region.innerHTML.trim(); });

    function schedule(delay) {
      if (timer !== null) {
        clearTimeout(timer);
      }
      timer = setTimeout(refresh, delay);
    }

    function refresh() {
      timer = null;
      if (inFlight) {
        again = true;
        return;
      }
      if (regions.some(isBusy)) {
        setStatus("Live: updates paused while you edit a form", true);
        schedule(BUSY_RETRY_MS);
        return;
      }
      var ids = Array.from(touched);
      touched.clear();
      var quiet = catchUp && !ids.length; // no event asked for it: flash only what changed
      catchUp = false;
      var retry = false;
      inFlight = true;
      fetch(src, { headers: { "X-Board-Partial": "1" }, credentials: "same-origin", cache: "no-store" })
        .then(function (response) {
          if (response.redirected || !response.ok) {
            throw new Error("partial refresh answered " + response.status);
          }
          return response.text();
        })
        .then(function (html) {
          if (regions.some(isBusy)) { // the operator began editing while it was on its way
            ids.forEach(function (id) { touched.add(id); });
            catchUp = catchUp || quiet;
            setStatus("Live: updates paused while you edit a form", true);
            retry = true;
            return;
          }
          var doc = new DOMParser().parseFromString(html, "text/html");
          var changed = [];
          regions.forEach(function (region, index) {
            var part = doc.querySelector('[data-live-part="' + region.getAttribute("data-live-part") + '"]');
            if (part && part.innerHTML.trim() !== shown[index]) {
              var before = new Set(Array.from(region.querySelectorAll("[data-todo-id]"), function (el) {
                return el.getAttribute("data-todo-id");
              }));
              region.innerHTML = part.innerHTML;
              shown[index] = part.innerHTML.trim();
              changed.push(region);
              if (quiet) { // no event named them: the rows this catch-up brought are the news
                region.querySelectorAll("[data-todo-id]").forEach(function (el) {
                  var id = el.getAttribute("data-todo-id");
                  if (!before.has(id) && ids.indexOf(id) < 0) {
                    ids.push(id);
                  }
                });
              }
            }
          });
          markUpdated(root, ids);
          if (onlyTodo && !(quiet && !changed.length)) {
            regions.forEach(function (region) {
              region.classList.remove("is-updated");
              void region.offsetWidth;
              region.classList.add("is-updated");
            });
          }
          setStatus("Live", true);
        })
        .catch(function () {
          setStatus("Live updates stopped: reload the page", false);
        })
        .finally(function () {
          inFlight = false;
          if (retry) {
            again = false; // the retry refreshes for it too
            schedule(BUSY_RETRY_MS);
          } else if (again) {
            again = false;
            schedule(DEBOUNCE_MS);
          }
        });
    }

    var stream = new EventSource("/api/v1/stream");
    stream.addEventListener("open", function () {
      setStatus("Live", true);
      catchUp = true;
      schedule(DEBOUNCE_MS);
    });
    stream.addEventListener("error", function () {
      setStatus(stream.readyState === EventSource.CLOSED ? "Live updates unavailable: reload to refresh"
        : "Reconnecting…", false);
    });
    stream.addEventListener("todo", function (event) {
      var change;
      try {
        change = JSON.parse(event.data);
      } catch (error) {
        return;
      }
      if (onlyTodo && change.todo_id !== onlyTodo) {
        return;
      }
      if (change.todo_id) {
        touched.add(change.todo_id);
      }
      schedule(DEBOUNCE_MS);
    });
    window.addEventListener("pagehide", function () {
      stream.close();
    });
  }

  function confirmations() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      var question = form && form.getAttribute && form.getAttribute("data-confirm");
      if (question && !window.confirm(question)) {
        event.preventDefault();
      }
    });
  }

  function copyButtons() {
    if (!navigator.clipboard) {
      return;
    }
    document.querySelectorAll("[data-copy]").forEach(function (button) {
      button.hidden = false;
      button.addEventListener("click", function () {
        var source = document.querySelector(button.getAttribute("data-copy"));
        if (!source) {
          return;
        }
        var label = button.textContent;
        navigator.clipboard.writeText(source.textContent.trim()).then(function () {
          button.textContent = "Copied";
          setTimeout(function () { button.textContent = label; }, 1500);
        });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    confirmations();
    var root = document.querySelector("[data-live-src]");
    if (root) {
      setStatus("Connecting…", false);
      startLive(root); // first: it keeps each region's HTML as the server sent it
    }
    copyButtons();
  });
})();
