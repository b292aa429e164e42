/* Hatchery playground widget: turns <pre data-hatchery-run data-template="...">
 * blocks into editable snippets with a Run button and a streaming output panel.
 * No dependencies. Include with
 *   <link rel="stylesheet" href="https://PLAYGROUND/playground/widget.css">
 *   <script src="https://PLAYGROUND/playground/widget.js" defer></script>
 * The gateway address is taken from the script's own URL, or from a
 * data-endpoint attribute on the script tag. */
(function () {
  "use strict";
  var script = document.currentScript;
  var endpoint = (script && script.getAttribute("data-endpoint")) ||
    (script && script.src ? new URL(script.src, location.href).origin : location.origin);

  var REFUSALS = {
    too_large: "This snippet is too long to run here. Try a shorter one.",
    rate_limited: "You are running snippets faster than the playground allows.",
    busy: "The playground is busy right now.",
    unknown_template: "This example asks for an environment the playground does not offer.",
    invalid_json: "The playground could not read this request.",
    unavailable: "The playground could not run this snippet just now. Please try again.",
  };

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function retryText(seconds) {
    return seconds ? " Try again in " + seconds + " s." : " Try again in a moment.";
  }

  function Widget(pre) {
    var self = this;
    this.template = pre.getAttribute("data-template") || "code-interpreter";
    var code = pre.textContent.replace(/^\n/, "").replace(/\s+$/, "") + "\n";
    var box = el("div", "hx-pg");
    box.setAttribute("data-state", "idle");
    var editor = el("textarea", "hx-pg-code");
    editor.value = code;
    editor.spellcheck = false;
    editor.setAttribute("aria-label", "Code (editable)");
    editor.rows = Math.min(Math.max(code.split("\n").length, 2), 30);
    var bar = el("div", "hx-pg-bar");
    var button = el("button", "hx-pg-run", "Run");
    button.type = "button";
    var hint = el("span", "hx-pg-hint", "Ctrl+Enter");
    var msg = el("div", "hx-pg-msg");
    msg.setAttribute("role", "status");
    var out = el("pre", "hx-pg-out");
    out.setAttribute("aria-live", "polite");
    out.hidden = true;
    bar.appendChild(button);
    bar.appendChild(hint);
    bar.appendChild(msg);
    box.appendChild(editor);
    box.appendChild(bar);
    box.appendChild(out);
    pre.parentNode.replaceChild(box, pre);
    this.box = box; this.editor = editor; this.button = button; this.msg = msg; this.out = out;

    button.addEventListener("click", function () { self.run(); });
    editor.addEventListener("keydown", function (ev) {
      if ((ev.ctrlKey || ev.metaKey) && ev.key === "Enter") { ev.preventDefault(); self.run(); }
      else if (ev.key === "Tab" && !ev.shiftKey) {
        ev.preventDefault();
        var s = editor.selectionStart;
        editor.setRangeText("    ", s, editor.selectionEnd, "end");
      }
    });
    editor.addEventListener("input", function () {
      editor.rows = Math.min(Math.max(editor.value.split("\n").length + 1, 2), 30);
    });
  }

  Widget.prototype.say = function (kind, text) {
    this.msg.setAttribute("data-kind", kind);
    this.msg.textContent = text;
  };

  Widget.prototype.append = function (stream, text) {
    var span = el("span", stream === "stderr" ? "hx-pg-stderr" : "hx-pg-stdout", text);
    this.out.appendChild(span);
    this.out.hidden = false;
    this.out.scrollTop = this.out.scrollHeight;
  };

  Widget.prototype.finish = function (state) {
    this.box.setAttribute("data-state", state);
    this.button.disabled = false;
    this.button.textContent = "Run";
  };

  Widget.prototype.onExit = function (x) {
    var tail = x.cached ? " (cached result)" : "";
    if (x.timed_out) {
      this.say("timeout", "Stopped: the snippet ran into the time limit." + tail);
    } else if (x.truncated) {
      this.say("truncated", "Output was cut off at the size limit, and the snippet was stopped." + tail);
    } else if (x.oom_killed) {
      this.say("exit", "The snippet ran out of memory (exit status " + x.exit_code + ")." + tail);
    } else if (x.exception && x.exception.name) {
      // A Python snippet that raised: its traceback is in the output, in red.
      this.say("exit", "The snippet raised " + x.exception.name + "." + tail);
    } else if (x.exit_code === 0) {
      this.say("ok", "Finished in " + x.duration_ms + " ms." + tail);
    } else {
      this.say("exit", "Exited with status " + x.exit_code + "." + tail);
    }
    this.finish("done");
  };

  Widget.prototype.onRefusal = function (status, body, retryAfter) {
    var code = body && body.error && body.error.code;
    var text = REFUSALS[code] || (body && body.error && body.error.message) ||
      ("The playground answered " + status + ".");
    if (code === "rate_limited" || code === "busy") text += retryText(retryAfter);
    this.say("refused", text);
    this.finish("refused");
  };

  Widget.prototype.run = function () {
    if (this.button.disabled) return;
    var self = this;
    this.button.disabled = true;
    this.button.textContent = "Running\u2026";
    this.box.setAttribute("data-state", "running");
    this.out.textContent = "";
    this.out.hidden = true;
    this.say("running", "Running\u2026");
    var finished = false;
    fetch(endpoint + "/playground/run", {
      method: "POST",
      credentials: "include",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ code: this.editor.value, template: this.template }),
    }).then(function (resp) {
      if (!resp.ok) {
        var retry = resp.headers.get("Retry-After");
        return resp.json().catch(function () { return null; }).then(function (body) {
          finished = true;
          self.onRefusal(resp.status, body, retry);
        });
      }
      var reader = resp.body.getReader();
      var decoder = new TextDecoder();
      var buf = "";
      function handle(block) {
        var name = "message", data = [];
        block.split("\n").forEach(function (line) {
          if (line.indexOf("event:") === 0) name = line.slice(6).trim();
          else if (line.indexOf("data:") === 0) data.push(line.slice(5).replace(/^ /, ""));
        });
        if (!data.length) return;
        var payload = JSON.parse(data.join("\n"));
        if (name === "stdout" || name === "stderr") self.append(name, payload.data);
        else if (name === "exit") { finished = true; self.onExit(payload); }
        else if (name === "error") {
          finished = true;
          var err = payload.error || {};
          self.say("error", (REFUSALS[err.code] || err.message || "The run failed.") +
            (err.code === "busy" ? retryText(null) : ""));
          self.finish("error");
        }
      }
      function pump() {
        return reader.read().then(function (r) {
          if (r.done) return;
          buf += decoder.decode(r.value, { stream: true }).replace(/\r\n/g, "\n");
          var i;
          while ((i = buf.indexOf("\n\n")) >= 0) {
            handle(buf.slice(0, i));
            buf = buf.slice(i + 2);
          }
          return pump();
        });
      }
      return pump();
    }).catch(function () {
      if (!finished) { finished = true; self.say("error", "Could not reach the playground. Check your connection and try again."); }
    }).then(function () {
      if (!finished) self.say("error", "The connection to the playground ended early. Please try again.");
      if (self.button.disabled) self.finish(finished ? self.box.getAttribute("data-state") : "error");
    });
  };

  function init(root) {
    var blocks = (root || document).querySelectorAll("pre[data-hatchery-run]");
    var made = [];
    for (var i = 0; i < blocks.length; i++) made.push(new Widget(blocks[i]));
    return made;
  }

  window.HatcheryPlayground = { init: init, endpoint: endpoint };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { init(); });
  } else {
    init();
  }
})();
