// The operator's console of orchestra-sup (issue 23): one ES module, no framework, no build.
//
// It reads the tree through the HTTP API with the bearer token the operator pastes, kept in
// sessionStorage (this tab only) and sent as an Authorization header, never in a URL or a
// cookie. On opening it reads /v1/whoami, /v1/status, /v1/tree, /v1/plans and /v1/lanes once,
// then follows GET /v1/events?status=2 with fetch() and a stream reader (EventSource cannot send
// the header): each event marks what it concerns for a re-read, and the status message the
// server pushes every 2 s redraws the tree. Nothing is polled on a timer of the page's own.
// Tree data is only ever put in the page as text (textContent, Text nodes), never as markup.

const TOKEN_KEY = "orchestra-sup.token";
const STATUS_EVERY_S = 2; // the server's status message period (GET /v1/events?status=)
const EVENTS_KEPT = 300; // rows of the event log shown
const PLANS_SHOWN = 20; // newest plans shown, each with its tasks
const TRANSCRIPT_KEPT = 2000; // transcript rows shown for the chosen lane
const LOGS_PAGE = 1000; // rows asked for at once (GET /v1/lanes/{lane}/logs?limit=)
const BACKOFF_FIRST_MS = 500; // the stream's first retry; doubling up to BACKOFF_MAX_MS
const BACKOFF_MAX_MS = 10000;
const REFRESH_MS = 200; // events within this are gathered into one re-read
const VERBS = [
  ["approve", "approve", "Approve"],
  ["reject", "reject", "Reject"],
  ["redirect", "redirect", "Redirect"],
  ["accept_partial", "accept-partial", "Accept partial"],
]; // [the pause's `accepts` name, the API's path verb, the button's label]
const DEFAULT_ACCEPTS = ["approve", "reject", "redirect"]; // a pause from a tree that does not say
const NO_LANE = "Choose a lane (in Plans or Lanes) to follow its output.";
const LANE_STATES = ["running", "starting", "awaiting_approval", "paused", "stopping"];

class Unreachable extends Error {}
class TokenRefused extends Error {}
class ApiError extends Error {
  constructor(status, code, message) {
    super(`${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

const state = {
  session: null, // {token, abort: AbortController}
  who: null, // {name, role}
  lastEventId: null, // the seq of the last event seen: the stream resumes after it
  linked: false, // the event stream is open
  status: null,
  tree: null,
  plans: [],
  reports: new Map(), // plan id -> its report (GET /v1/plans/{id})
  lanes: [],
  unanswered: [],
  transcript: { lane: null, after: null, done: false },
  events: 0,
  dirty: new Set(), // loaders to run at the next refresh ("plans", "report:ID", ...)
  refreshing: false,
  refreshTimer: null,
  cards: new Map(), // lane -> its question card (kept, so a half-typed answer survives)
};

const $ = (id) => document.getElementById(id);

/** An element: attributes set as strings (null/false: left out), children appended as
 * nodes or as text. */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// --- the API ---------------------------------------------------------------------------

function headers(extra = {}) {
  return { Authorization: `Bearer ${state.session.token}`, ...extra };
}

/** The JSON answer of one request; throws Unreachable (no answer), TokenRefused (401) or
 * ApiError (the API's {"error": {"code", "message"}}). */
async function api(path, { method = "GET", body } = {}) {
  const session = state.session;
  const extra = body === undefined ? {} : { "Content-Type": "application/json" };
  let response;
  let data;
  try {
    response = await fetch(path, {
      method,
      body,
      headers: headers(extra),
      cache: "no-store",
      signal: session.abort.signal,
    });
    data = await response.json().catch(() => null);
  } catch (err) {
    if (session.abort.signal.aborted) throw err;
    unreachable();
    throw new Unreachable(String(err));
  }
  if (response.status === 401) {
    tokenRefused();
    throw new TokenRefused();
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(response.status, error.code || "http", error.message || response.statusText);
  }
  return data;
}

const lanePath = (lane) => `/v1/lanes/${encodeURIComponent(lane)}`;

// --- loaders: each reads one resource and redraws its panel --------------------------------

const loaders = {
  async who() {
    state.who = await api("/v1/whoami");
    $("who").textContent = `token ${state.who.name} (${state.who.role})`;
    renderQuestions();
  },
  async status() {
    renderStatus(await api("/v1/status"));
  },
  async tree() {
    state.tree = await api("/v1/tree");
    renderTree();
  },
  async plans() {
    state.plans = (await api("/v1/plans")).plans;
    const shown = new Set(state.plans.slice(0, PLANS_SHOWN).map((p) => p.id));
    for (const id of state.reports.keys()) if (!shown.has(id)) state.reports.delete(id);
    for (const id of shown) if (!state.reports.has(id)) state.dirty.add(`report:${id}`);
    renderPlans();
  },
  async lanes() {
    const answer = await api("/v1/lanes");
    state.lanes = answer.lanes;
    state.unanswered = answer.unanswered;
    renderLanes();
    renderQuestions();
  },
  async transcript() {
    await loadTranscript();
  },
};

async function loadReport(id) {
  try {
    state.reports.set(id, await api(`/v1/plans/${encodeURIComponent(id)}`));
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 404)) throw err;
    state.reports.delete(id); // pruned meanwhile
  }
  renderPlans();
}

/** Run one loader, its refusal shown in its panel ("report:ID" in the plans panel). Throws
 * only Unreachable, TokenRefused, or an abort (the console was closed meanwhile). */
async function load(name) {
  const report = name.startsWith("report:");
  const shown = document.querySelector(`[data-error-for="${report ? "plans" : name}"]`);
  try {
    if (report) await loadReport(name.slice("report:".length));
    else await loaders[name]();
    shown.hidden = true;
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    shown.textContent = `${name}: ${err.message}`;
    shown.hidden = false;
  }
}

/** Mark loaders to run; they run together, REFRESH_MS later, one refresh at a time. */
function mark(...names) {
  for (const name of names) state.dirty.add(name);
  if (state.refreshTimer === null && !state.refreshing) {
    state.refreshTimer = setTimeout(refresh, REFRESH_MS);
  }
}

async function refresh() {
  state.refreshTimer = null;
  state.refreshing = true;
  const names = [...state.dirty];
  state.dirty.clear();
  try {
    await Promise.all(names.map(load));
  } catch {
    // shown already (the banner, or the token form)
  } finally {
    state.refreshing = false;
    if (state.dirty.size && state.session) mark();
  }
}

/** Every panel read again (on opening, and after the stream was down); throws as `load`. */
async function loadAll() {
  await Promise.all(["who", "status", "tree", "plans", "lanes"].map(load));
  const reports = [...state.dirty].filter((name) => name.startsWith("report:"));
  for (const name of reports) state.dirty.delete(name);
  await Promise.all(reports.map(load));
}

// --- the event stream -----------------------------------------------------------------------

/** Follow GET /v1/events for as long as `session` is the open one: resume after the last id
 * seen, retry with a doubling backoff when it ends or fails. `stale`: the panels could not be
 * read, so read them once the stream is open (as after every reconnection: the tree may have
 * restarted meanwhile). */
async function follow(session, stale) {
  let delay = BACKOFF_FIRST_MS;
  while (state.session === session) {
    try {
      const extra = state.lastEventId === null ? {} : { "Last-Event-ID": state.lastEventId };
      // a first connection starts at the newest rows shown, not at the oldest event kept
      const query = `status=${STATUS_EVERY_S}&tail=${EVENTS_KEPT}`;
      const response = await fetch(`/v1/events?${query}`, {
        headers: headers(extra),
        cache: "no-store",
        signal: session.abort.signal,
      });
      if (response.status === 401) return tokenRefused();
      if (!response.ok) throw new Error(`the event stream answered ${response.status}`);
      linked(true);
      delay = BACKOFF_FIRST_MS;
      if (stale) loadAll().catch(() => {}); // shown already: the banner, or the token form
      stale = true;
      await readEvents(response.body, dispatch);
    } catch (err) {
      if (session.abort.signal.aborted) return;
    }
    if (state.session !== session) return;
    unreachable(delay);
    await pause(delay, session.abort.signal);
    delay = Math.min(delay * 2, BACKOFF_MAX_MS);
  }
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    const stop = () => {
      clearTimeout(timer);
      resolve();
    };
    signal.addEventListener("abort", stop, { once: true });
  });
}

/** Read server-sent events from `body` until it ends, calling `onEvent({type, id, data})` for
 * each: `id:`, `event:` and `data:` lines (several data lines joined by "\n"), `:` comments
 * skipped, a blank line ending an event; lines end in "\n" (a "\r" before it is dropped). */
async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { type: "", id: null, data: null };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end).replace(/\r$/, "");
      buffer = buffer.slice(end + 1);
      if (line === "") {
        if (event.data !== null) onEvent({ ...event, type: event.type || "message" });
        event = { type: "", id: null, data: null };
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "data") event.data = event.data === null ? text : `${event.data}\n${text}`;
        else if (field === "event") event.type = text;
        else if (field === "id" && !text.includes("\0")) event.id = text;
      }
    }
  }
}

function dispatch({ type, id, data }) {
  if (type === "status") {
    renderStatus(JSON.parse(data));
    if (state.transcript.lane && !state.transcript.done) mark("transcript");
    return;
  }
  if (id !== null) state.lastEventId = id;
  const event = JSON.parse(data);
  showEvent(event);
  for (const name of concerns(event)) mark(name);
}

/** The loaders an event calls for: what it changed. */
function concerns(event) {
  const kind = event.kind;
  const names = [];
  if (/^(plan|task|hitl|budget|quota|lane)\./.test(kind)) names.push("plans", "lanes");
  if (event.plan && state.plans.slice(0, PLANS_SHOWN).some((p) => p.id === event.plan)) {
    names.push(`report:${event.plan}`);
  }
  if (/^(child|supervisor)\./.test(kind)) names.push("status");
  if (/^(reload|rollover)\./.test(kind)) names.push("status", "tree");
  if (kind === "retention.pruned") names.push("plans");
  if (event.lane && event.lane === state.transcript.lane) names.push("transcript");
  return names;
}

// --- the link, the banner and the token ------------------------------------------------------

function linked(up) {
  state.linked = up;
  const link = $("link");
  link.dataset.link = up ? "live" : "down";
  link.textContent = up ? "live" : "unreachable";
  $("panels").classList.toggle("stale", !up);
  if (up) banner(null);
}

function unreachable(retryMs) {
  linked(false);
  const when = retryMs === undefined ? "" : ` in ${Math.round(retryMs / 100) / 10} s`;
  banner("unreachable", `tree unreachable — retrying${when}`);
}

function banner(kind, text = "") {
  const node = $("banner");
  node.hidden = kind === null;
  node.dataset.kind = kind || "";
  node.textContent = text;
}

function tokenRefused() {
  close();
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin();
  banner("refused", "token refused — paste a valid token (keys init --http-token NAME)");
}

function showLogin() {
  $("panels").hidden = true;
  $("forget").hidden = true;
  $("login").hidden = false;
  $("who").textContent = "";
  $("link").dataset.link = "off";
  $("link").textContent = "not connected";
  $("token-input").focus();
}

function close() {
  if (state.session) state.session.abort.abort();
  state.session = null;
  clearTimeout(state.refreshTimer);
  state.refreshTimer = null;
  state.dirty.clear();
}

/** Open the console with `token`: read every panel, then follow the event stream. */
async function open(token) {
  close();
  const session = { token, abort: new AbortController() };
  Object.assign(state, {
    session,
    who: null,
    lastEventId: null,
    plans: [],
    lanes: [],
    unanswered: [],
    events: 0,
  });
  state.reports.clear();
  state.cards.clear();
  for (const id of ["questions", "plans", "lanes", "events"]) $(id).replaceChildren();
  chooseLane(null);
  $("login").hidden = true;
  $("panels").hidden = false;
  $("forget").hidden = false;
  banner(null);
  let stale = false;
  try {
    await loadAll();
  } catch (err) {
    if (err instanceof TokenRefused || state.session !== session) return;
    stale = true;
  }
  follow(session, stale);
}

// --- drawing ---------------------------------------------------------------------------------

/** Seconds for people: "42 s", "15 min", "3 h". */
function duration(s) {
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

const lag = (ms) => (ms ? ms.map((x) => x.toFixed(1)).join("/") : "-");

function renderStatus(status) {
  state.status = status;
  const s = status.supervisor;
  $("supervisor").textContent =
    `supervisor pid ${s.pid} · ${s.version} · loop lag ms p50/p99/max ${lag(s.loop_lag_ms)}` +
    ` · isolation ${s.isolation}`;
  renderTree();
  renderQuestions(); // their waiting times
}

/** The tree's rows: supervisors from /v1/tree, each worker's numbers from the latest status. */
function renderTree() {
  const children = new Map(((state.status && state.status.children) || []).map((c) => [c.name, c]));
  const rows = [];
  const walk = (node, depth) => {
    if (node.children) {
      rows.push(supervisorRow(node, depth));
      for (const child of node.children) walk(child, depth + 1);
    } else {
      rows.push(childRow(children.get(node.name) || node, depth));
      children.delete(node.name);
    }
  };
  if (state.tree && state.tree.name) walk(state.tree, 0);
  for (const child of children.values()) rows.push(childRow(child, 0)); // hosts' shards, or no tree
  document.querySelector("#tree tbody").replaceChildren(...rows);
}

function supervisorRow(node, depth) {
  const limit = `at most ${node.max_restarts} restarts in ${node.max_seconds} s`;
  const strategy = `${node.strategy}, ${limit}`;
  return el(
    "tr",
    { class: "supervisor", "data-depth": Math.min(depth, 4), "data-supervisor": node.name },
    el("td", {}, node.name),
    el("td", { colspan: 6 }, strategy),
  );
}

function childRow(child, depth) {
  const known = (value) => (value === null || value === undefined ? "-" : String(value));
  return el(
    "tr",
    {
      "data-child": child.name,
      "data-generation": child.generation,
      "data-state": child.state,
      "data-depth": Math.min(depth, 4),
    },
    el("td", {}, child.name),
    el("td", { "data-label": "role" }, known(child.role)),
    el("td", { "data-label": "pid" }, known(child.pid)),
    el("td", { "data-label": "gen", class: "gen" }, known(child.generation)),
    el("td", {}, badge(child.state)),
    el("td", { "data-label": "restarts" }, known(child.restarts)),
    el("td", { "data-label": "loop lag ms" }, lag(child.loop_lag_ms)),
  );
}

function badge(text) {
  return el("span", { class: "badge", "data-state": text }, text.replace(/_/g, " "));
}

const planState = (p) => (p.done ? (p.ok ? "succeeded" : "failed") : "running");

function renderPlans() {
  const shown = state.plans.slice(0, PLANS_SHOWN);
  $("no-plans").hidden = shown.length > 0;
  $("plans").replaceChildren(...shown.map(planCard));
}

function planCard(plan) {
  const counts = Object.entries(plan.tasks)
    .map(([status, n]) => `${n} ${status.replace(/_/g, " ")}`)
    .join(", ");
  const report = state.reports.get(plan.id);
  const when = new Date(plan.submitted_at * 1000).toLocaleTimeString();
  return el(
    "article",
    { class: "plan", "data-plan-id": plan.id, "data-state": planState(plan) },
    el(
      "h3",
      {},
      el("span", { class: "name" }, plan.plan),
      " ",
      badge(planState(plan)),
      el("span", { class: "meta" }, ` ${plan.id} · ${when} · ${counts || "no task"}`),
    ),
    report ? planDetail(report) : null,
  );
}

function planDetail(report) {
  const tasks = report.tasks.map((task) =>
    el(
      "li",
      { "data-task": task.id, "data-state": task.status },
      el("span", { class: "name" }, task.id),
      " ",
      badge(task.status),
      task.lane ? laneButton(task.lane) : null,
      el("span", { class: "meta" }, taskFacts(task)),
    ),
  );
  const lanes = report.lanes.map((lane) =>
    el(
      "li",
      { "data-state": lane.status },
      badge(lane.status),
      lane.lane ? laneButton(lane.lane) : " waits for a shard",
      el("span", { class: "meta" }, ` ${lane.run}`),
    ),
  );
  const error = report.error ? el("p", { class: "error" }, report.error) : null;
  return el("div", {}, el("ul", { class: "tasks" }, ...tasks, ...lanes), error);
}

function taskFacts(task) {
  const facts = [];
  if (task.shard) facts.push(`on ${task.shard}`);
  if (task.attempts > 1) facts.push(`${task.attempts} attempts`);
  if (task.exit_code !== null) facts.push(`exit ${task.exit_code}`);
  if (task.duration_s) facts.push(`${task.duration_s.toFixed(1)} s`);
  const answer = task.answers[task.answers.length - 1];
  if (answer) facts.push(`${answer.verdict} by ${answer.responder}`);
  if (task.failure) facts.push(task.failure);
  if (task.error) facts.push(task.error);
  return facts.length ? ` ${facts.join(" · ")}` : "";
}

function laneButton(lane) {
  const chosen = lane === state.transcript.lane;
  const button = el("button", { type: "button", class: "lane", "data-show-lane": lane }, lane);
  if (chosen) button.setAttribute("aria-pressed", "true");
  return button;
}

function renderLanes() {
  const groups = new Map();
  for (const lane of state.lanes) {
    if (!groups.has(lane.state)) groups.set(lane.state, []);
    groups.get(lane.state).push(lane);
  }
  const order = [...groups.keys()].sort(
    (a, b) => rank(a) - rank(b) || a.localeCompare(b),
  );
  const sections = order.map((name) =>
    el(
      "div",
      { class: "lane-group", "data-lane-state": name },
      el("h3", {}, badge(name), ` ${groups.get(name).length}`),
      el("ul", {}, ...groups.get(name).map(laneItem)),
    ),
  );
  if (state.unanswered.length) {
    const missing = `not answering, their lanes not listed: ${state.unanswered.join(", ")}`;
    sections.push(el("p", { class: "error" }, missing));
  }
  $("no-lanes").hidden = state.lanes.length > 0;
  $("lanes").replaceChildren(...sections);
}

function rank(laneState) {
  const at = LANE_STATES.indexOf(laneState);
  return at < 0 ? LANE_STATES.length : at;
}

function laneItem(lane) {
  const where = lane.shard ? `on ${lane.shard}` : "no shard yet";
  return el(
    "li",
    { "data-lane-item": lane.lane },
    laneButton(lane.lane),
    el("span", { class: "meta" }, ` ${lane.task || "-"} · plan ${lane.plan || "-"} · ${where}`),
  );
}

/** The question cards: one per lane waiting for an answer, kept while it waits. */
function renderQuestions() {
  const waiting = state.lanes.filter((l) => l.state === "awaiting_approval" && l.question);
  const now = new Set(waiting.map((l) => l.lane));
  for (const [lane, card] of state.cards) {
    if (!now.has(lane)) {
      card.remove();
      state.cards.delete(lane);
    }
  }
  const box = $("questions");
  for (const lane of waiting) {
    let card = state.cards.get(lane.lane);
    if (!card || card.dataset.role !== (state.who ? state.who.role : "")) {
      const made = questionCard(lane);
      if (card) card.replaceWith(made);
      else box.append(made);
      card = made;
      state.cards.set(lane.lane, card);
    }
    const since = lane.since ? Math.max(0, Date.now() / 1000 - lane.since) : 0;
    card.querySelector(".since").textContent = `waiting ${duration(since)}`;
  }
  $("question-count").textContent = String(waiting.length);
  $("no-questions").hidden = waiting.length > 0;
}

function questionCard(lane) {
  const role = state.who ? state.who.role : "";
  const card = el(
    "article",
    { class: "question", "data-lane": lane.lane, "data-plan": lane.plan || "", "data-role": role },
    el("h3", {}, lane.task || lane.lane, " ", el("span", { class: "since meta" })),
    el("p", { class: "ask" }, lane.question),
    el("p", { class: "meta" }, `lane ${lane.lane} · plan ${lane.plan || "-"}`),
  );
  if (role === "operate") card.append(...answerControls(lane));
  else card.append(el("p", { class: "readonly" }, "This token may read, not answer."));
  return card;
}

function answerControls(lane) {
  const id = `answer-${lane.lane}`;
  const text = el("textarea", { id, rows: 2, placeholder: "why, or what to do instead" });
  const accepts = lane.accepts && lane.accepts.length ? lane.accepts : DEFAULT_ACCEPTS;
  const note = el("p", { class: "outcome", role: "status" });
  const buttons = VERBS.filter(([name]) => accepts.includes(name)).map(([name, verb, label]) => {
    // a task that used its retries is approved with one more attempt (ctl approve --retries 1)
    const retries = name === "approve" && lane.needs_retries ? 1 : 0;
    const shown = retries ? `${label} +1 attempt` : label;
    const button = el("button", { type: "button", "data-verb": verb }, shown);
    button.addEventListener("click", () => answer(lane.lane, verb, text, note, retries));
    return button;
  });
  return [
    el("label", { for: id, class: "meta" }, "answer text (needed for reject and redirect)"),
    text,
    el("div", { class: "buttons" }, ...buttons),
    note,
  ];
}

async function answer(lane, verb, text, note, retries) {
  if (verb === "redirect" && !text.value.trim()) {
    note.textContent = "a redirect needs a text: what to do instead";
    return;
  }
  if (verb === "reject" && !text.value.trim()) {
    note.textContent = "a reject needs a text: why";
    return;
  }
  const card = state.cards.get(lane);
  const buttons = card ? [...card.querySelectorAll("button")] : [];
  for (const b of buttons) b.disabled = true;
  note.textContent = `sending ${verb}…`;
  try {
    const body = JSON.stringify(retries ? { text: text.value, retries } : { text: text.value });
    const done = await api(`${lanePath(lane)}/${verb}`, { method: "POST", body });
    note.textContent = `${verb}: ${done.outcome}`;
    mark("lanes", "plans", `report:${done.plan}`);
  } catch (err) {
    note.textContent = err instanceof ApiError ? err.message : "not sent: the tree is unreachable";
    for (const b of buttons) b.disabled = false;
  }
}

// --- the transcript --------------------------------------------------------------------------

/** Follow `lane`'s transcript from its first row (null: none). */
function chooseLane(lane) {
  state.transcript = { lane, after: null, done: false };
  $("transcript-lane").textContent = lane || "";
  $("transcript").replaceChildren();
  $("transcript-note").textContent = lane ? "reading…" : NO_LANE;
  $("transcript-note").hidden = false;
  for (const b of document.querySelectorAll("[data-show-lane]")) {
    if (b.dataset.showLane === lane) b.setAttribute("aria-pressed", "true");
    else b.removeAttribute("aria-pressed");
  }
  if (lane) mark("transcript");
}

/** The chosen lane's rows after the last one shown, page by page. */
async function loadTranscript() {
  const t = state.transcript;
  const lane = t.lane;
  while (lane && state.transcript === t) {
    const after = t.after === null ? "" : `&after=${t.after}`;
    let chunk;
    try {
      chunk = await api(`${lanePath(lane)}/logs?limit=${LOGS_PAGE}${after}`);
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) throw err;
      $("transcript-note").textContent = "no transcript yet: the lane has not started";
      return;
    }
    if (state.transcript !== t) return;
    appendRows(chunk.rows);
    t.done = chunk.done;
    $("transcript-lane").textContent = `${lane}${t.done ? " (ended)" : ""}`;
    if (chunk.rows.length < LOGS_PAGE) return;
  }
}

function appendRows(rows) {
  const pre = $("transcript");
  for (const row of rows) {
    pre.append(el("span", { class: "row", "data-stream": row.stream }, row.data));
    state.transcript.after = row.seq;
  }
  while (pre.childNodes.length > TRANSCRIPT_KEPT) pre.firstChild.remove();
  const note = $("transcript-note");
  note.hidden = pre.childNodes.length > 0;
  if (!note.hidden) note.textContent = "no output yet";
  pre.scrollTop = pre.scrollHeight;
}

// --- the event log ---------------------------------------------------------------------------

function showEvent(event) {
  const list = $("events");
  const about = ["plan", "task", "lane", "child"]
    .filter((key) => event[key])
    .map((key) => `${key} ${event[key]}`)
    .join(" · ");
  const who = event.who ? ` · by ${event.who}` : "";
  const row = el(
    "li",
    { "data-seq": event.seq, "data-kind": event.kind },
    el("time", {}, new Date(event.at * 1000).toLocaleTimeString()),
    " ",
    el("span", { class: "kind" }, event.kind),
    el("span", { class: "meta" }, ` ${about}${who}`),
    event.detail ? el("span", { class: "detail" }, ` ${event.detail}`) : null,
  );
  list.prepend(row);
  while (list.childElementCount > EVENTS_KEPT) list.lastElementChild.remove();
  state.events += 1;
  $("event-count").textContent = String(state.events);
}

// --- start ------------------------------------------------------------------------------------

function start() {
  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    const token = $("token-input").value.trim();
    $("token-input").value = "";
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    open(token);
  });
  $("forget").addEventListener("click", () => {
    close();
    sessionStorage.removeItem(TOKEN_KEY);
    banner(null);
    showLogin();
  });
  document.addEventListener("click", (e) => {
    const button = e.target.closest("[data-show-lane]");
    if (button) chooseLane(button.dataset.showLane);
  });
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) open(token);
  else showLogin();
}

start();
