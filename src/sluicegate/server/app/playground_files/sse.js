// An event-stream parser that follows the WHATWG "event stream interpretation"
// rules, fed text as it arrives (decode the bytes with a streaming TextDecoder
// first, so that a character split across reads is whole here).
//
// Lines end in CRLF, LF or CR; a CR at the very end of what was fed so far is
// held until the next feed tells whether an LF follows. One leading U+FEFF is
// dropped. A blank line dispatches the pending event, unless it has no data line
// (then nothing is dispatched, as the spec says). A line starting with ":" is a
// comment: a keep-alive heartbeat, here returned as its own item so that the
// inspector can show it. An event cut off by the end of the stream (no blank
// line after it) is not dispatched.
//
// Deliberate divergence: the spec leaves comments out of what a page sees;
// feed() returns them, as {kind: "comment"} items, between the events.
//
// Items returned by feed() and flush():
//   {kind: "event", type, data, id, retry, bytes}  type defaults to "message";
//     data is the data lines joined with "\n"; id is the last event id so far;
//     retry is the last valid retry field (ms) or null; bytes is the UTF-8 size of
//     the event's lines, terminators and dispatching blank line included.
//   {kind: "comment", text, bytes}  text without the leading ":" (and one space).
//
// Spec: https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation

const encoder = new TextEncoder();

function utf8Length(text) {
  return encoder.encode(text).length;
}

export class SSEDecoder {
  constructor() {
    this.buffer = "";
    this.first = true;
    this.data = [];
    this.type = "";
    this.lastId = "";
    this.retry = null;
    this.pendingBytes = 0;
  }

  // Returns the items that every complete line fed so far completes.
  feed(text) {
    if (this.first && text.length > 0) {
      this.first = false;
      if (text.charCodeAt(0) === 0xfeff) {
        text = text.slice(1);
        this.pendingBytes += 3;
      }
    }
    this.buffer += text;
    const items = [];
    for (;;) {
      const cut = lineEnd(this.buffer);
      if (cut === null) {
        return items;
      }
      const [end, skip] = cut;
      const line = this.buffer.slice(0, end);
      const size = utf8Length(this.buffer.slice(0, end + skip));
      this.buffer = this.buffer.slice(end + skip);
      const item = this.line(line, size);
      if (item !== null) {
        items.push(item);
      }
    }
  }

  // The end of the stream. A CR left at the end ends its line after all (no LF
  // can follow), so that line is handled, and may dispatch; a last line without
  // any terminator is still a line, but cannot dispatch: only its comment, if it
  // is one, comes out. An event not dispatched by then is dropped; the decoder
  // is fresh afterwards.
  flush() {
    const rest = this.buffer;
    const items = [];
    this.buffer = "";
    if (rest.endsWith("\r")) {
      const item = this.line(rest.slice(0, -1), utf8Length(rest));
      if (item !== null) {
        items.push(item);
      }
    } else if (rest.length > 0) {
      const item = this.line(rest, utf8Length(rest));
      if (item !== null && item.kind === "comment") {
        items.push(item);
      }
    }
    this.data = [];
    this.type = "";
    this.pendingBytes = 0;
    this.first = true;
    return items;
  }

  line(line, size) {
    if (line === "") {
      return this.dispatch(size);
    }
    if (line.startsWith(":")) {
      const text = line.slice(1);
      return {kind: "comment", text: text.startsWith(" ") ? text.slice(1) : text, bytes: size};
    }
    this.pendingBytes += size;
    const colon = line.indexOf(":");
    const name = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) {
      value = value.slice(1);
    }
    if (name === "data") {
      this.data.push(value);
    } else if (name === "event") {
      this.type = value;
    } else if (name === "id") {
      if (!value.includes("\0")) {
        this.lastId = value;
      }
    } else if (name === "retry") {
      if (/^[0-9]+$/.test(value)) {
        this.retry = Number(value);
      }
    }
    return null;
  }

  dispatch(size) {
    const bytes = this.pendingBytes + size;
    this.pendingBytes = 0;
    if (this.data.length === 0) {
      this.type = "";
      return null;
    }
    const item = {
      kind: "event",
      type: this.type || "message",
      data: this.data.join("\n"),
      id: this.lastId,
      retry: this.retry,
      bytes,
    };
    this.data = [];
    this.type = "";
    return item;
  }
}

// [index of the line's end, length of its terminator], or null while the buffer
// holds no whole line (a trailing CR may be the first half of a CRLF).
function lineEnd(buffer) {
  const lf = buffer.indexOf("\n");
  const cr = buffer.indexOf("\r");
  if (cr === -1 || (lf !== -1 && lf < cr)) {
    return lf === -1 ? null : [lf, 1];
  }
  if (cr === buffer.length - 1) {
    return null;
  }
  return [cr, buffer[cr + 1] === "\n" ? 2 : 1];
}
