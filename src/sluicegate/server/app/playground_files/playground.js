// The playground page: builds a request from the form, streams it with fetch and
// a stream reader (POST: EventSource cannot), and paints each event as it comes:
// the inspector row, the text of each choice, tool calls, logprobs on hover, the
// timing strip and, at the end, the end state and usage.

import {SSEDecoder} from "./sse.js";
import {StreamRecord} from "./stream.js";
import {ServerView} from "./server.js";

const MAX_EVENT_ROWS = 2000;

function el(id) {
  return document.getElementById(id);
}

function mode() {
  return el("mode-completion").checked ? "completion" : "chat";
}

function settings() {
  return {baseUrl: el("base-url").value.trim(), adminKey: el("admin-key").value.trim()};
}

function numberField(id, body, name, parse = Number) {
  const value = el(id).value.trim();
  if (value !== "") {
    body[name] = parse(value);
  }
}

function jsonField(id, what) {
  const value = el(id).value.trim();
  if (value === "") {
    return null;
  }
  try {
    return JSON.parse(value);
  } catch (error) {
    throw new Error(`${what} is not JSON: ${error.message}`);
  }
}

// The request body from the form; throws an Error naming a field it cannot read.
export function requestBody() {
  const body = {stream: true};
  const model = el("model").value;
  if (model) {
    body.model = model;
  }
  const prompt = el("prompt").value;
  if (mode() === "chat") {
    const system = el("system").value.trim();
    body.messages = [...(system ? [{role: "system", content: system}] : []),
      {role: "user", content: prompt}];
    const tools = jsonField("tools", "tools");
    if (tools !== null) {
      body.tools = tools;
    }
  } else {
    body.prompt = prompt;
  }
  numberField("temperature", body, "temperature");
  numberField("top-p", body, "top_p");
  numberField("max-tokens", body, "max_tokens", (v) => parseInt(v, 10));
  numberField("n", body, "n", (v) => parseInt(v, 10));
  numberField("seed", body, "seed", (v) => parseInt(v, 10));
  const stop = el("stop").value.split("\n").filter((s) => s !== "");
  if (stop.length) {
    body.stop = stop;
  }
  if (el("logprobs").checked) {
    body.logprobs = mode() === "chat" ? true : Number(el("top-logprobs").value || 0);
    if (mode() === "chat") {
      numberField("top-logprobs", body, "top_logprobs", (v) => parseInt(v, 10));
    }
  }
  if (el("include-usage").checked) {
    body.stream_options = {include_usage: true};
  }
  const extra = jsonField("extra", "more body fields");
  if (extra !== null) {
    if (typeof extra !== "object" || Array.isArray(extra)) {
      throw new Error("more body fields must be a JSON object");
    }
    Object.assign(body, extra);
  }
  return body;
}

class Painter {
  // Paints one response into the page, starting from a clean slate.
  constructor(record) {
    this.record = record;
    this.rows = 0;
    this.choiceNodes = new Map();
    el("choices").replaceChildren();
    el("events").replaceChildren();
    el("events-caption").textContent = "0 events";
    el("timing-strip").replaceChildren();
    el("timing-summary").textContent = "TTFT: -";
    el("usage").textContent = "";
    el("abort-report").textContent = "";
    this.state("streaming");
  }

  state(text) {
    const node = el("end-state");
    node.textContent = text;
    node.dataset.state = text;
  }

  row(atMs, bytes, kind, payload) {
    this.rows += 1;
    el("events-caption").textContent = `${this.rows} events`;
    if (this.rows > MAX_EVENT_ROWS) {
      return;
    }
    const tr = document.createElement("tr");
    tr.className = kind;
    for (const text of [atMs.toFixed(1), String(bytes), kind]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    const td = document.createElement("td");
    const pre = document.createElement("pre");
    pre.textContent = payload;
    td.append(pre);
    tr.append(td);
    el("events").append(tr);
  }

  choiceNode(index) {
    if (!this.choiceNodes.has(index)) {
      const article = document.createElement("article");
      article.className = "choice";
      article.setAttribute("aria-labelledby", `choice-${index}-heading`);
      const heading = document.createElement("h3");
      heading.id = `choice-${index}-heading`;
      heading.textContent = `Choice ${index}`;
      // The model's reasoning, apart from its answer; shown once some arrives.
      const reasoning = document.createElement("details");
      reasoning.className = "reasoning";
      reasoning.open = true;
      reasoning.hidden = true;
      const summary = document.createElement("summary");
      summary.textContent = "Reasoning";
      const thought = document.createElement("div");
      thought.id = `choice-${index}-reasoning`;
      reasoning.append(summary, thought);
      const text = document.createElement("div");
      text.className = "text";
      text.id = `choice-${index}-text`;
      text.setAttribute("aria-live", "polite");
      const tools = document.createElement("div");
      tools.className = "tools";
      tools.id = `choice-${index}-tools`;
      const finish = document.createElement("p");
      finish.className = "finish";
      finish.id = `choice-${index}-finish`;
      article.append(heading, reasoning, text, tools, finish);
      el("choices").append(article);
      this.choiceNodes.set(index, {reasoning, thought, text, tools, finish});
    }
    return this.choiceNodes.get(index);
  }

  delta(delta) {
    const node = this.choiceNode(delta.index);
    if (delta.reasoning) {
      node.reasoning.hidden = false;
      node.thought.append(delta.reasoning);
    }
    if (delta.text) {
      if (delta.title) {
        const span = document.createElement("span");
        span.title = delta.title;
        span.textContent = delta.text;
        node.text.append(span);
      } else {
        node.text.append(delta.text);
      }
    }
    if (delta.toolCalls.length) {
      const calls = this.record.choice(delta.index).toolCalls;
      node.tools.textContent = calls
        .map((c, i) => `tool call ${i}: ${c.name}(${c.arguments})${c.id ? `  id ${c.id}` : ""}`)
        .join("\n");
    }
    if (delta.finishReason) {
      node.finish.textContent = `finish_reason: ${delta.finishReason}`;
      node.finish.dataset.finishReason = delta.finishReason;
    }
  }

  timing() {
    const {firstTokenMs, gapsMs} = this.record;
    if (firstTokenMs === null) {
      return;
    }
    const strip = el("timing-strip");
    if (strip.childElementCount === 0) {
      const bar = document.createElement("span");
      bar.className = "first";
      bar.title = `TTFT ${firstTokenMs.toFixed(1)} ms`;
      bar.style.height = "100%";
      strip.append(bar);
    }
    while (strip.childElementCount <= gapsMs.length) {
      const gap = gapsMs[strip.childElementCount - 1];
      const bar = document.createElement("span");
      bar.title = `gap ${gap.toFixed(1)} ms`;
      bar.style.height = `${Math.min(100, gap / 2)}%`;  // 200 ms fills the strip
      strip.append(bar);
    }
    const sorted = [...gapsMs].sort((a, b) => a - b);
    const median = sorted.length ? sorted[Math.floor(sorted.length / 2)].toFixed(1) : "-";
    el("timing-summary").textContent =
      `TTFT: ${firstTokenMs.toFixed(1)} ms; ${gapsMs.length} inter-token gaps, median ${median} ms`;
    strip.setAttribute("aria-label", `TTFT ${firstTokenMs.toFixed(0)} ms, then ${gapsMs.length} gaps`);
  }

  end(note) {
    const record = this.record;
    this.state(record.endState);
    const usage = record.usage;
    el("usage").textContent = (usage
      ? `usage: ${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`
      : "no usage") + (note ? `; ${note}` : "");
  }
}

class Playground {
  constructor() {
    this.controller = null;
    this.server = new ServerView(settings);
  }

  async loadModels() {
    const {baseUrl} = settings();
    try {
      const response = await fetch(`${baseUrl.replace(/\/+$/, "")}/models`, {headers: this.headers()});
      const list = await response.json();
      const select = el("model");
      const current = select.value;
      select.replaceChildren(new Option("(server default)", ""),
        ...list.data.map((m) => new Option(m.id, m.id)));
      select.value = list.data.some((m) => m.id === current) ? current : "";
      el("form-error").textContent = "";
    } catch (error) {
      el("form-error").textContent = `Could not load models: ${error.message}`;
    }
  }

  headers() {
    const key = el("api-key").value.trim();
    return key ? {Authorization: `Bearer ${key}`} : {};
  }

  async send() {
    let body;
    try {
      body = requestBody();
    } catch (error) {
      el("form-error").textContent = error.message;
      return;
    }
    el("form-error").textContent = "";
    const path = mode() === "chat" ? "/chat/completions" : "/completions";
    const url = settings().baseUrl.replace(/\/+$/, "") + path;
    const record = new StreamRecord(mode(), body.n || 1);
    const painter = new Painter(record);
    this.controller = new AbortController();
    el("send").disabled = true;
    el("stop-button").disabled = false;
    const started = performance.now();
    let note = "";
    try {
      await this.stream(url, body, record, painter, started);
    } catch (error) {
      if (error.name === "AbortError") {
        record.end(true);
      } else {
        note = `connection: ${error.message}`;
      }
    }
    this.controller = null;
    el("send").disabled = false;
    el("stop-button").disabled = true;
    painter.end(note);
    if (record.clientGone) {
      await this.server.confirmAbort(record.responseId, record.n);
    }
    this.server.refresh();
  }

  async stream(url, body, record, painter, started) {
    const response = await fetch(url, {
      method: "POST",
      headers: {"Content-Type": "application/json", ...this.headers()},
      body: JSON.stringify(body),
      signal: this.controller.signal,
    });
    record.status(response.status);
    if (!response.ok) {
      const text = await response.text();
      painter.row(performance.now() - started, text.length, "error", pretty(text));
      return;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder("utf-8");
    const sse = new SSEDecoder();
    for (;;) {
      const {value, done} = await reader.read();
      const atMs = performance.now() - started;
      const text = done ? decoder.decode() : decoder.decode(value, {stream: true});
      const items = done ? [...sse.feed(text), ...sse.flush()] : sse.feed(text);
      for (const item of items) {
        this.item(item, atMs, record, painter);
      }
      if (done) {
        return;
      }
    }
  }

  item(item, atMs, record, painter) {
    if (item.kind === "comment") {
      painter.row(atMs, item.bytes, "comment", `: ${item.text}  (heartbeat)`);
      return;
    }
    const change = record.feed(item.data, atMs);
    const payload = change.json !== null ? JSON.stringify(change.json, null, 2) : item.data;
    painter.row(atMs, item.bytes, change.kind, payload);
    for (const delta of change.deltas) {
      painter.delta(delta);
    }
    painter.timing();
  }

  stop() {
    if (this.controller !== null) {
      this.controller.abort();
    }
  }

  start() {
    el("base-url").value = `${location.origin}/v1`;
    el("request-form").addEventListener("submit", (event) => {
      event.preventDefault();
      if (this.controller === null) {
        this.send();
      }
    });
    el("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        el("request-form").requestSubmit();
      }
    });
    el("stop-button").addEventListener("click", () => this.stop());
    el("load-models").addEventListener("click", () => this.loadModels());
    el("base-url").addEventListener("change", () => this.loadModels());
    for (const radio of document.querySelectorAll("input[name=mode]")) {
      radio.addEventListener("change", () => this.showMode());
    }
    this.showMode();
    this.loadModels();
    this.server.start();
  }

  showMode() {
    const chat = mode() === "chat";
    el("system-row").hidden = !chat;
    el("tools-row").hidden = !chat;
    el("prompt-label").textContent = chat ? "User message" : "Prompt";
  }
}

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

const playground = new Playground();
window.sluicegatePlayground = playground;
playground.start();
