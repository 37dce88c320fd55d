// The taskhost dashboard. Plain script, no dependencies, served with a CSP
// that allows only this origin. Every text from the server is set with
// textContent (task labels and output come from models and plugins).
//
// Live updates come from GET /dashboard/api/events (server-sent events) read
// with fetch() so the token travels in the Authorization header; EventSource
// cannot send headers, and the token never goes into a URL.
"use strict";

const TOKEN_KEY = "taskhost-dashboard-token";
const api = "/dashboard/api";

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  viewer: null,
  tasks: new Map(), // id -> task
  selected: null, // selected task id
  outputEnd: 0, // byte offset the output pane reached
  outputBusy: false,
  outputAgain: false,
  stream: null, // AbortController of the event stream
  retryMs: 500,
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

class Unauthorized extends Error {}

async function call(path, options) {
  const response = await fetch(api + path, {
    ...(options || {}),
    headers: { Authorization: "Bearer " + state.token },
    cache: "no-store",
    credentials: "omit",
  });
  if (response.status === 401) throw new Unauthorized("the token was refused");
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function showLogin(message) {
  if (state.stream) state.stream.abort();
  state.stream = null;
  state.viewer = null;
  $("board").hidden = true;
  $("sign-out").hidden = true;
  $("viewer").textContent = "";
  $("connection").dataset.state = "idle";
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("token").focus();
}

async function open() {
  try {
    state.viewer = await call("/session");
  } catch (error) {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    showLogin(error instanceof Unauthorized ? "That token was refused." : String(error.message));
    return;
  }
  $("login").hidden = true;
  $("board").hidden = false;
  $("sign-out").hidden = false;
  $("viewer").textContent = state.viewer.admin
    ? `signed in as ${state.viewer.name} (admin: every owner's tasks)`
    : `signed in as ${state.viewer.name}`;
  document.body.dataset.viewer = state.viewer.name;
  document.body.dataset.admin = String(state.viewer.admin);
  follow();
}

// ---- the event stream ----

async function follow() {
  const controller = new AbortController();
  state.stream = controller;
  $("connection").dataset.state = "connecting";
  try {
    const response = await fetch(api + "/events", {
      headers: { Authorization: "Bearer " + state.token, Accept: "text/event-stream" },
      cache: "no-store",
      credentials: "omit",
      signal: controller.signal,
    });
    if (response.status === 401) {
      showLogin("The token was refused.");
      return;
    }
    if (!response.ok || !response.body) throw new Error("event stream: HTTP " + response.status);
    $("connection").dataset.state = "live";
    state.retryMs = 500;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        dispatch(block);
      }
    }
  } catch (error) {
    if (controller.signal.aborted) return;
    console.warn("dashboard event stream:", error);
  }
  if (state.stream !== controller) return;
  // The server stopped or the network dropped: reconnect (a fresh
  // snapshot arrives first), backing off up to 10 s.
  $("connection").dataset.state = "lost";
  setTimeout(() => {
    if (state.stream === controller) follow();
  }, state.retryMs);
  state.retryMs = Math.min(state.retryMs * 2, 10000);
}

function dispatch(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (!data.length) return;
  const payload = JSON.parse(data.join("\n"));
  switch (event) {
    case "snapshot":
      state.tasks = new Map(payload.tasks.map((task) => [task.id, task]));
      renderTasks();
      if (state.selected && state.tasks.has(state.selected)) refreshOutput();
      break;
    case "task":
      state.tasks.set(payload.id, payload);
      renderTasks();
      if (payload.id === state.selected) refreshOutput();
      break;
    case "released":
      state.tasks.delete(payload.id);
      renderTasks();
      break;
    case "output":
      if (payload.id === state.selected) refreshOutput();
      break;
    case "plugins":
      renderPlugins(payload.plugins);
      break;
  }
}

// ---- tasks ----

function formatTime(ms) {
  return new Date(ms).toLocaleTimeString();
}

function formatDuration(task) {
  const end = task.finished_at_ms ?? Date.now();
  const seconds = Math.max(0, Math.round((end - task.started_at_ms) / 1000));
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${seconds % 60} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

function isLive(task) {
  return task.status === "running" || task.status === "stopping";
}

function taskRow(task) {
  const row = el("tr", { "data-task-id": task.id, "data-status": task.status, "data-owner": task.owner, "data-node": task.node || "" });
  if (task.id === state.selected) row.classList.add("selected");
  row.append(
    // On a cluster, the node that runs it (`node`) is the id's tooltip.
    el("td", task.node ? { class: "id", title: `runs on node ${task.node}` } : { class: "id" }, task.id),
    el("td", { class: "kind" }, task.kind),
    el("td", { class: "status", title: task.status_line }, task.detail ? `${task.status} (${task.detail})` : task.status),
    el("td", { class: "label" }, task.label),
    el("td", { class: "owner" }, task.owner),
    el("td", { class: "version" }, task.producer_info || "—"),
    el("td", { class: "started" }, formatTime(task.started_at_ms)),
    el("td", { class: "duration" }, formatDuration(task)),
  );
  const actions = el("td", { class: "actions" });
  if (isLive(task)) {
    const kill = el("button", { type: "button", "data-action": "kill", "data-task-id": task.id }, "Kill");
    if (task.status === "stopping") kill.disabled = true;
    actions.append(kill);
  }
  row.append(actions);
  return row;
}

function renderTasks() {
  const table = $("tasks");
  for (const body of [...table.tBodies]) body.remove();
  const groups = new Map();
  for (const task of state.tasks.values()) {
    if (!groups.has(task.owner)) groups.set(task.owner, []);
    groups.get(task.owner).push(task);
  }
  for (const [owner, tasks] of groups) {
    const body = el("tbody", { "data-owner": owner });
    if (state.viewer && state.viewer.admin) {
      const header = el("tr", { class: "group" });
      header.append(el("th", { colspan: "9" }, `owner: ${owner} (${tasks.length})`));
      body.append(header);
    }
    for (const task of tasks) body.append(taskRow(task));
    table.append(body);
  }
  $("no-tasks").hidden = state.tasks.size > 0;
}

function tickDurations() {
  for (const row of document.querySelectorAll("tr[data-task-id]")) {
    const task = state.tasks.get(row.dataset.taskId);
    if (task && isLive(task)) row.querySelector("td.duration").textContent = formatDuration(task);
  }
}

async function kill(id, button) {
  button.disabled = true;
  try {
    const reply = await call(`/tasks/${encodeURIComponent(id)}/kill`, { method: "POST" });
    say(reply.text, reply.is_error);
    if (reply.task) {
      // Settlement arrives as an event; until then the row says stopping.
      const known = state.tasks.get(id);
      if (!known || isLive(known)) state.tasks.set(id, reply.task);
      renderTasks();
    }
  } catch (error) {
    if (error instanceof Unauthorized) return showLogin("The token was refused.");
    say(String(error.message), true);
    button.disabled = false;
  }
}

function say(text, isError) {
  const message = $("message");
  message.textContent = text;
  message.className = isError ? "error" : "";
}

// ---- output ----

function select(id) {
  state.selected = id;
  state.outputEnd = 0;
  $("output").textContent = "";
  $("output").dataset.taskId = id;
  $("output-task").textContent = id;
  $("output-note").textContent = "Following new output live; reading it here does not consume it.";
  for (const row of document.querySelectorAll("tr[data-task-id]")) {
    row.classList.toggle("selected", row.dataset.taskId === id);
  }
  refreshOutput();
}

async function refreshOutput() {
  if (state.outputBusy) {
    state.outputAgain = true;
    return;
  }
  state.outputBusy = true;
  try {
    do {
      state.outputAgain = false;
      const id = state.selected;
      if (!id) break;
      const peek = await call(`/tasks/${encodeURIComponent(id)}/output?since=${state.outputEnd}`);
      if (id !== state.selected) continue;
      const pane = $("output");
      const atBottom = pane.scrollTop + pane.clientHeight >= pane.scrollHeight - 4;
      if (peek.skipped > 0) pane.append(`[… ${peek.skipped} older bytes not kept …]\n`);
      if (peek.text) pane.append(peek.text);
      state.outputEnd = peek.end;
      pane.dataset.end = String(peek.end);
      pane.dataset.status = peek.task.status;
      if (atBottom) pane.scrollTop = pane.scrollHeight;
    } while (state.outputAgain);
  } catch (error) {
    if (error instanceof Unauthorized) showLogin("The token was refused.");
    else $("output-note").textContent = String(error.message);
  } finally {
    state.outputBusy = false;
  }
}

// ---- plugins ----

function renderPlugins(plugins) {
  const body = $("plugins").tBodies[0];
  body.replaceChildren();
  for (const plugin of plugins) {
    const row = el("tr", { "data-plugin": plugin.tool, "data-serving": plugin.serving });
    const live = plugin.live_by_version.map((v) => `${v.version}: ${v.live}`).join(", ") || "none";
    const reload = plugin.last_reload;
    const reloadCell = el("td", { class: "reload" }, reload ? `${reload.text} (${formatTime(reload.at_ms)})` : "—");
    if (reload) reloadCell.dataset.ok = String(reload.ok);
    row.append(el("td", {}, plugin.tool), el("td", { class: "version" }, plugin.serving), el("td", {}, live), reloadCell);
    body.append(row);
  }
  $("no-plugins").hidden = plugins.length > 0;
}

// ---- wiring ----

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    if (!token) return;
    $("token").value = "";
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    open();
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    state.tasks.clear();
    state.selected = null;
    showLogin("");
  });
  $("tasks").addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action='kill']");
    if (button) {
      event.stopPropagation();
      kill(button.dataset.taskId, button);
      return;
    }
    const row = event.target.closest("tr[data-task-id]");
    if (row) select(row.dataset.taskId);
  });
  setInterval(tickDurations, 1000);
  if (state.token) open();
  else showLogin("");
});
