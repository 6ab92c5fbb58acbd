/* Switchboard operator board: live regions over Server-Sent Events, confirmations, copy buttons.
 *
 * A page with `[data-live-src]` opens `/api/v1/stream`. After `todo` events (debounced 150 ms)
 * it fetches `data-live-src` with the header `X-Board-Partial: 1`; the answer holds one
 * `[data-live-part=NAME]` element per live region of the page, whose content replaces the
 * region's. On a todo page (`data-live-todo`) only that todo's events count. While the operator
 * is editing a form inside a live region (focus in a field, or a field changed from what the
 * server sent), the refresh waits, and a refresh that arrives once editing began is not applied.
 *
 * The stream starts after the log position the page was rendered at (`data-live-after`, read
 * before the page's data), so a transition that commits while the page loads still comes as an
 * event. A region whose server HTML did not change is left as it is. A region holding a form the
 * server filled back in after a refused action (`data-refilled`) counts as being edited while any
 * of that input is still there.
 * A focused control keeps the focus across a refresh when the region still has it (known by what it
 * does: a link's target, a button's action and label, a field's name; not by its place). One that a
 * refresh took away (a Claim button while the todo is claimed) gets it back when a later refresh
 * within a minute brings it back, unless the operator moved the focus, clicked or typed meanwhile.
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

  function typedIn(field) {
    return field.value !== "" || (field.validity && field.validity.badInput); // "12e" in a number field reads ""
  }

  function presetIndex(select) {
    // the option the page was sent with: one marked `selected`, else the first enabled one
    var options = Array.prototype.slice.call(select.options);
    var preset = options.findIndex(function (option) { return option.defaultSelected; });
    return preset >= 0 ? preset : options.findIndex(function (option) { return !option.disabled; });
  }

  function isBusy(region) {
    // the operator's refused input, shown again: kept while any of it is there
    var refilled = region.querySelectorAll("[data-refilled]");
    for (var r = 0; r < refilled.length; r++) {
      var kept = refilled[r].querySelectorAll(
        "input:not([type=hidden]):not([type=checkbox]):not([type=radio]), textarea, select option[selected]");
      if (Array.prototype.some.call(kept, function (el) { return el.tagName === "OPTION" || typedIn(el); })) {
        return true;
      }
    }
    var active = document.activeElement;
    if (active && region.contains(active) && active.matches("input, textarea, select")) {
      return true;
    }
    var fields = region.querySelectorAll("input:not([type=hidden]), textarea");
    for (var i = 0; i < fields.length; i++) {
      var field = fields[i];
      var dirty = field.type === "checkbox" || field.type === "radio"
        ? field.checked !== field.defaultChecked
        : field.value !== field.defaultValue || (field.validity && field.validity.badInput);
      if (dirty) {
        return true;
      }
    }
    var selects = region.querySelectorAll("select");
    for (var j = 0; j < selects.length; j++) {
      var select = selects[j];
      if (!select.options.length) {
        continue;
      }
      if (select.multiple) {
        if (Array.prototype.some.call(select.options, function (o) { return o.selected !== o.defaultSelected; })) {
          return true;
        }
      } else if (select.selectedIndex !== presetIndex(select)) {
        return true;
      }
    }
    return false;
  }

  var FOCUSABLE = "a[href], button, input, select, textarea, summary";
  var LOST_FOCUS_MS = 60000; // how long a control a refresh took away may get the focus back

  function identity(el) {
    // what names a control across refreshes: a link by its target, a button by the action it
    // submits and its label, a field by its form's action and its name (never by its place alone:
    // a new row shifts every row below it)
    if (el.tagName === "A") {
      return "a " + el.getAttribute("href");
    }
    if (el.tagName === "SUMMARY") {
      return "summary " + el.textContent.trim();
    }
    var action = el.form ? el.form.getAttribute("action") || "" : "";
    if (el.tagName === "BUTTON") {
      return "button " + (el.getAttribute("formaction") || action) + " " + el.textContent.trim();
    }
    return el.tagName.toLowerCase() + " " + action + " " + (el.name || el.id || "");
  }

  function focusedIn(region) {
    // where the keyboard focus is in a region: the focused control's identity and place
    var active = document.activeElement;
    if (!active || !region.contains(active) || !active.matches(FOCUSABLE)) {
      return null;
    }
    var all = Array.prototype.slice.call(region.querySelectorAll(FOCUSABLE));
    return { key: identity(active), index: all.indexOf(active) };
  }

  function refocus(region, focused) {
    // a keyboard user keeps their place: the same control, if the refreshed region still has it
    // (of several alike, the one nearest its old place)
    if (!focused) {
      return;
    }
    var best = null;
    var distance = Infinity;
    region.querySelectorAll(FOCUSABLE).forEach(function (el, index) {
      if (identity(el) === focused.key && Math.abs(index - focused.index) < distance) {
        best = el;
        distance = Math.abs(index - focused.index);
      }
    });
    if (best) {
      best.focus({ preventScroll: true });
    }
  }

  function nothingFocused() {
    return !document.activeElement || document.activeElement === document.body;
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
    // the control a refresh took the focus from, its region's index and when, until the operator
    // moves the focus, clicks or types, or LOST_FOCUS_MS pass
    var lost = null;
    ["focusin", "pointerdown", "keydown"].forEach(function (type) {
      document.addEventListener(type, function () { lost = null; }, true);
    });
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
            setStatus("Live: updates paused while you edit a form", true);
            retry = true;
            return;
          }
          var doc = new DOMParser().parseFromString(html, "text/html");
          var changed = [];
          regions.forEach(function (region, index) {
            var part = doc.querySelector('[data-live-part="' + region.getAttribute("data-live-part") + '"]');
            if (part && part.innerHTML.trim() !== shown[index]) {
              var focused = focusedIn(region);
              var restoring = !focused && lost !== null && lost.region === index && nothingFocused()
                && Date.now() - lost.at < LOST_FOCUS_MS;
              region.innerHTML = part.innerHTML;
              refocus(region, restoring ? lost.focused : focused); // given back: `focusin` clears `lost`
              if (focused && !region.contains(document.activeElement)) {
                lost = { region: index, focused: focused, at: Date.now() };
              }
              shown[index] = part.innerHTML.trim();
              changed.push(region);
            }
          });
          markUpdated(root, ids);
          if (onlyTodo && changed.length) {
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

    // from the position the page was rendered at: what committed since comes as events (a
    // reconnecting EventSource sends Last-Event-ID, which the server takes over `after`)
    var after = root.getAttribute("data-live-after");
    var stream = new EventSource("/api/v1/stream" + (after ? "?after=" + encodeURIComponent(after) : ""));
    stream.addEventListener("open", function () {
      setStatus("Live", true);
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
