// What one streamed response has said so far: the text, tool calls and logprobs
// of each choice, usage, an in-band error, [DONE]; its timing; and how it ended,
// classified by the same rule as the Python client (sluicegate.core.endstate).
//
// A StreamRecord is fed the data of each SSE event (feed) and told of the
// status (status) and of the end (end); it renders nothing itself: feed()
// returns what changed, for the page to paint.
//
// Spec: OpenAI API reference, "The chat completion chunk object" and
// "Create completion" (stream); docs/DESIGN.md, "End states".

export const DONE = "[DONE]";

// The end state, first rule that holds wins (endstate.classify):
// a non-200 status: rejected; an in-band error: errored; every choice finished
// and [DONE] seen: finished; the client gave up: aborted; else truncated (also
// when no status came at all).
export function classify(status, finishedChoices, n, sawDone, error, clientGone) {
  if (status !== null && status !== 200) {
    return "rejected";
  }
  if (error !== null) {
    return "errored";
  }
  if (finishedChoices >= n && sawDone) {
    return "finished";
  }
  if (clientGone) {
    return "aborted";
  }
  return "truncated";
}

function newChoice(index) {
  return {index, text: "", reasoning: "", finishReason: null, toolCalls: [], tokens: 0};
}

// The logprobs of one chunk's choice as a hover text: "token  logprob  (top
// alternatives)" per token; "" when it carries none.
export function logprobsTitle(logprobs) {
  if (!logprobs) {
    return "";
  }
  const lines = [];
  if (Array.isArray(logprobs.content)) {
    for (const entry of logprobs.content) {
      const top = (entry.top_logprobs || [])
        .map((alt) => `${JSON.stringify(alt.token)} ${alt.logprob.toFixed(3)}`);
      lines.push(`${JSON.stringify(entry.token)} ${entry.logprob.toFixed(3)}` +
        (top.length ? `  (${top.join(", ")})` : ""));
    }
  } else if (Array.isArray(logprobs.tokens)) {
    logprobs.tokens.forEach((token, i) => {
      const value = (logprobs.token_logprobs || [])[i];
      const top = ((logprobs.top_logprobs || [])[i]) || {};
      const alts = Object.entries(top).map(([t, v]) => `${JSON.stringify(t)} ${v.toFixed(3)}`);
      lines.push(`${JSON.stringify(token)} ${value == null ? "?" : value.toFixed(3)}` +
        (alts.length ? `  (${alts.join(", ")})` : ""));
    });
  }
  return lines.join("\n");
}

export class StreamRecord {
  // mode: "chat" or "completion"; n: choices asked for (>= 1).
  constructor(mode, n) {
    this.mode = mode;
    this.n = n;
    this.statusCode = null;
    this.choices = new Map();
    this.usage = null;
    this.error = null;
    this.sawDone = false;
    this.clientGone = false;
    this.responseId = null;
    this.malformed = 0;
    this.firstTokenMs = null;
    this.lastTokenMs = null;
    this.gapsMs = [];
  }

  status(code) {
    this.statusCode = code;
  }

  choice(index) {
    if (!this.choices.has(index)) {
      this.choices.set(index, newChoice(index));
    }
    return this.choices.get(index);
  }

  // Feed one event's data, which arrived atMs after the request was sent.
  // Returns {kind, json, deltas}: kind is "done", "error", "chunk" or "malformed";
  // deltas lists {index, text, reasoning, title, toolCalls, finishReason} per
  // choice touched.
  feed(data, atMs) {
    if (data === DONE) {
      this.sawDone = true;
      return {kind: "done", json: null, deltas: []};
    }
    let json;
    try {
      json = JSON.parse(data);
    } catch {
      this.malformed += 1;
      return {kind: "malformed", json: null, deltas: []};
    }
    if (json === null || typeof json !== "object") {
      this.malformed += 1;
      return {kind: "malformed", json, deltas: []};
    }
    if (json.error) {
      this.error = json.error;
      return {kind: "error", json, deltas: []};
    }
    if (json.id && this.responseId === null) {
      this.responseId = json.id;
    }
    if (json.usage) {
      this.usage = json.usage;
    }
    const deltas = (json.choices || []).map((c) => this.feedChoice(c));
    if (deltas.some((d) => d.text || d.reasoning || d.toolCalls.length)) {
      this.token(atMs);
    }
    return {kind: "chunk", json, deltas};
  }

  feedChoice(raw) {
    const choice = this.choice(raw.index || 0);
    const delta = this.mode === "chat" ? (raw.delta || {}) : raw;
    const text = typeof delta.content === "string" ? delta.content
      : typeof delta.text === "string" ? delta.text : "";
    choice.text += text;
    // reasoning_content (sluicegate, vLLM, llama.cpp), else reasoning (newer vLLM).
    const reasoning = typeof delta.reasoning_content === "string" && delta.reasoning_content
      ? delta.reasoning_content
      : typeof delta.reasoning === "string" ? delta.reasoning : "";
    choice.reasoning += reasoning;
    const toolCalls = Array.isArray(delta.tool_calls) ? delta.tool_calls : [];
    for (const part of toolCalls) {
      const index = part.index || 0;
      while (choice.toolCalls.length <= index) {
        choice.toolCalls.push({id: null, name: "", arguments: ""});
      }
      const call = choice.toolCalls[index];
      call.id = part.id || call.id;
      const fn = part.function || {};
      call.name += fn.name || "";
      call.arguments += fn.arguments || "";
    }
    if (raw.finish_reason) {
      choice.finishReason = raw.finish_reason;
    }
    return {
      index: choice.index,
      text,
      reasoning,
      title: logprobsTitle(raw.logprobs),
      toolCalls,
      finishReason: raw.finish_reason || null,
    };
  }

  token(atMs) {
    if (this.firstTokenMs === null) {
      this.firstTokenMs = atMs;
    } else {
      this.gapsMs.push(atMs - this.lastTokenMs);
    }
    this.lastTokenMs = atMs;
  }

  // The client stopped reading (Stop pressed) before the end.
  end(clientGone) {
    this.clientGone = clientGone;
  }

  get finishedChoices() {
    let count = 0;
    for (const choice of this.choices.values()) {
      count += choice.finishReason !== null ? 1 : 0;
    }
    return count;
  }

  get endState() {
    return classify(this.statusCode, this.finishedChoices, this.n, this.sawDone,
      this.error, this.clientGone);
  }
}
