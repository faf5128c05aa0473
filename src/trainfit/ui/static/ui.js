// trainfit ui: live validation of the spec editor and a job's log as it grows. No library, no build.
"use strict";

function problemsList(problems) {
  const ul = document.createElement("ul");
  ul.className = "problems";
  for (const p of problems) {
    const li = document.createElement("li");
    const key = document.createElement("code");
    key.textContent = p.key;
    li.append(key, ": " + p.message + (p.hint ? " (" + p.hint + ")" : ""));
    ul.append(li);
  }
  return ul;
}

function specEditor(form) {
  const yaml = form.querySelector("#yaml");
  const savedText = yaml.value;
  const box = document.getElementById("validation");
  const actions = form.querySelectorAll("#actions button");
  let timer = null, valid = box.classList.contains("ok");

  function refreshButtons() {
    const dirty = yaml.value.trim() !== savedText.trim();
    document.getElementById("dirty-note").hidden = !dirty;
    actions.forEach((b) => { b.disabled = dirty || !valid; });
  }
  async function validate() {
    const body = new FormData(form);
    const reply = await fetch(form.dataset.validate, {method: "POST", body: body});
    const result = await reply.json();
    valid = Boolean(result.ok);
    box.className = valid ? "ok" : "bad";
    box.replaceChildren(valid ? document.createTextNode("valid") : problemsList(result.problems || [{key: "ui", message: result.error || "?"}]));
    document.getElementById("overrides").textContent =
      (result.overrides || []).length ? "passed as: " + result.overrides.map((o) => "--set " + o).join(" ") : "";
    refreshButtons();
  }
  function changed(event) {
    const el = event.target;
    if (el.dataset && el.dataset.knob !== undefined) {
      const now = el.type === "checkbox" ? (el.checked ? "true" : "false") : el.value;
      el.closest("tr").classList.toggle("changed", now !== el.dataset.initial);
    }
    refreshButtons();
    clearTimeout(timer);
    timer = setTimeout(validate, 250);
  }
  form.addEventListener("input", changed);
  form.addEventListener("change", changed);
  refreshButtons();
}

function renderLog(text) {
  // A progress line redraws itself with \r: keep what the terminal would show, the last draw of each line.
  return text.split("\n").map((line) => { const parts = line.split("\r"); return parts[parts.length - 1] || parts[parts.length - 2] || ""; }).join("\n");
}

function jobLog(pre) {
  let offset = 0, raw = "";
  const status = document.getElementById("status");
  const links = document.getElementById("links");
  async function poll() {
    let result;
    try {
      const reply = await fetch(pre.dataset.source + "?offset=" + offset);
      result = await reply.json();
    } catch (err) {
      setTimeout(poll, 2000);  // the UI restarting: try again
      return;
    }
    if (result.log) {
      raw += result.log;
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = renderLog(raw);
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
    offset = result.offset;
    status.textContent = result.status + (result.returncode !== null ? " (exit " + result.returncode + ")" : "")
      + (result.command_pid !== null
        ? " (its supervisor was killed: pid " + result.command_pid + " runs on, its exit unrecorded)" : "");
    status.className = "status " + result.status;
    links.replaceChildren(...result.links.map((l) => { const li = document.createElement("li"); const a = document.createElement("a"); a.href = l.href; a.textContent = l.name; li.append(a); return li; }));
    const stop = document.getElementById("stop"), resume = document.getElementById("resume");
    if (stop) stop.disabled = result.status !== "running";
    if (resume) resume.disabled = result.status === "running" || result.status === "finished";
    if (result.status === "running" || result.log) setTimeout(poll, 1000);
  }
  poll();
}

function refreshWhileRunning() {
  // The run list and a run's page show a running job's status: look again every 5 s until none runs,
  // unless the reader has started picking runs to compare.
  let touched = false;
  for (const event of ["change", "input", "focusin"]) document.addEventListener(event, () => { touched = true; });
  if (document.querySelector(".status.running")) setTimeout(() => { if (!touched) location.reload(); }, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  if (document.getElementById("jobs") || document.getElementById("figures")) refreshWhileRunning();
  const form = document.getElementById("spec-form");
  if (form) specEditor(form);
  const pre = document.getElementById("log");
  if (pre) jobLog(pre);
});
