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
  function searchMode(box) {
    // A knob searched has no fixed value: its value control is off, its choices field shows.
    const row = box.closest("tr"), choices = row.querySelector("input.choices");
    if (box.checked && !choices.value) choices.value = choices.dataset.suggested;
    choices.hidden = !box.checked;
    row.querySelectorAll("[data-knob]").forEach((c) => { c.disabled = box.checked; });
    row.classList.toggle("searched", box.checked);
  }
  function rowChanged(row) {
    const differs = [...row.querySelectorAll("[data-initial]")].some((c) =>
      (c.type === "checkbox" ? (c.checked ? "true" : "false") : c.value) !== c.dataset.initial && !c.disabled && !c.hidden);
    const box = row.querySelector("[data-search]");
    row.classList.toggle("changed", differs || (box && String(box.checked) !== box.dataset.initial));
  }
  form.querySelectorAll("[data-search]").forEach(searchMode);
  function changed(event) {
    const el = event.target;
    if (el.dataset && el.dataset.search !== undefined) searchMode(el);
    if (el.closest && el.closest("tr.knob")) rowChanged(el.closest("tr.knob"));
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

function logView(pre) {
  // Appends what each poll brings, never redrawing what is shown: the lines ended so far, as text nodes, and
  // the last line, not ended yet (a progress bar redraws it), in one node of its own.
  const last = document.createTextNode("");
  let pending = "";
  pre.append(last);
  return (text) => {
    const lines = (pending + text).split("\n");
    pending = lines.pop();
    if (lines.length) pre.insertBefore(document.createTextNode(renderLog(lines.join("\n")) + "\n"), last);
    last.data = renderLog(pending);
  };
}

function showCut(result) {
  // The first answer holds the log's end only: say how much came before, and where the whole log is.
  const note = document.getElementById("log-cut");
  if (!note || !result.cut) return;
  const link = document.createElement("a");
  link.href = result.whole_log;
  link.textContent = "the whole log";
  note.replaceChildren("The first " + (result.cut / 1048576).toFixed(1) + " MB of the log are not shown: ", link, ".");
  note.hidden = false;
}

function showLive(live) {
  // Where the run stands: a line, a training's or a comparison's progress bar, a tune's report framed
  // (sandboxed) and loaded again each time a trial rewrites it.
  const section = document.getElementById("live");
  if (!section || !live) return;
  section.hidden = false;
  document.getElementById("live-line").textContent = live.line;
  const bar = document.getElementById("live-progress");
  bar.hidden = !live.progress;
  if (live.progress) { bar.max = live.progress[1] || 1; bar.value = live.progress[0]; }
  const frame = document.getElementById("live-report");
  if (!live.href) return;
  frame.hidden = false;
  if (frame.dataset.version !== live.version) {
    frame.dataset.version = live.version;
    frame.src = live.href + "?v=" + encodeURIComponent(live.version);
  }
}

function jobLog(pre) {
  let offset = null;
  const status = document.getElementById("status");
  const links = document.getElementById("links");
  const append = logView(pre);
  async function poll() {
    let result;
    try {
      const reply = await fetch(pre.dataset.source + (offset === null ? "" : "?offset=" + offset));
      result = await reply.json();
    } catch (err) {
      setTimeout(poll, 2000);  // the UI restarting: try again
      return;
    }
    if (!result.ok) {  // e.g. a server restarted with another token: say what it said, and how to go on
      status.textContent = (result.error || "the UI server refused the request") + (result.hint ? ": " + result.hint : "");
      status.className = "status failed";
      return;
    }
    if (offset === null) showCut(result);
    if (result.log) {
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      append(result.log);
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
    offset = result.offset;
    status.textContent = result.status + (result.returncode !== null ? " (exit " + result.returncode + ")" : "")
      + (result.command_pid !== null
        ? " (its supervisor was killed: pid " + result.command_pid + " runs on, its exit unrecorded)" : "")
      + (result.problem ? " (" + result.problem + ")" : "");
    status.className = "status " + result.status;
    links.replaceChildren(...result.links.map((l) => { const li = document.createElement("li"); const a = document.createElement("a"); a.href = l.href; a.textContent = l.name; li.append(a); return li; }));
    showLive(result.live);
    const stop = document.getElementById("stop"), resume = document.getElementById("resume");
    if (stop) stop.disabled = result.status !== "running";
    if (resume) resume.disabled = ["running", "finished", "damaged"].includes(result.status);
    if (result.status === "running" || result.log) setTimeout(poll, 1000);
  }
  poll();
}

function oneSubmitEach() {
  // A double click on Resume (or any action) sent two requests: the second form is not sent, and the
  // buttons are disabled once the first is on its way (not at once: a disabled button's name and value,
  // the action it names, would be left out of the form). Back to the page (the browser's cache), they work again.
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form.dataset.sent) { event.preventDefault(); return; }
    form.dataset.sent = "1";
    const enabled = [...form.querySelectorAll("button")].filter((b) => !b.disabled);
    setTimeout(() => enabled.forEach((b) => { b.disabled = true; b.dataset.sentDisabled = "1"; }), 0);
  });
  window.addEventListener("pageshow", (event) => {
    if (!event.persisted) return;
    document.querySelectorAll("form[data-sent]").forEach((f) => { delete f.dataset.sent; });
    document.querySelectorAll("button[data-sent-disabled]").forEach((b) => { b.disabled = false; delete b.dataset.sentDisabled; });
  });
}

function refreshWhileRunning() {
  // The run list and a run's page show a running job's status: look again every 5 s until none runs,
  // unless the reader has started picking runs to compare.
  let touched = false;
  for (const event of ["change", "input", "focusin"]) document.addEventListener(event, () => { touched = true; });
  if (document.querySelector(".status.running")) setTimeout(() => { if (!touched) location.reload(); }, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  oneSubmitEach();
  if (document.getElementById("jobs") || document.getElementById("figures")) refreshWhileRunning();
  const form = document.getElementById("spec-form");
  if (form) specEditor(form);
  const pre = document.getElementById("log");
  if (pre) jobLog(pre);
});
