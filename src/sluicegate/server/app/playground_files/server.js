// The server view: engine stats and the ledger's recent requests, polled from a
// sluicegate server (GET /engine/stats, GET /engine/requests), and the check,
// after Stop, that the request was aborted in the engine and its KV cells freed.
//
// Another OpenAI-compatible server has no such routes: the view then says so.

const POLL_MS = 1000;
const CONFIRM_POLL_MS = 150;
const CONFIRM_GIVE_UP_MS = 15000;

// The server's root URL from an API base URL: ".../v1" without the "/v1".
export function serverRoot(baseUrl) {
  return baseUrl.replace(/\/+$/, "").replace(/\/v1$/, "");
}

function el(id) {
  return document.getElementById(id);
}

export class ServerView {
  // settings() returns {baseUrl, adminKey}.
  constructor(settings) {
    this.settings = settings;
    this.timer = null;
  }

  async get(path) {
    const {baseUrl, adminKey} = this.settings();
    const headers = adminKey ? {Authorization: `Bearer ${adminKey}`} : {};
    const response = await fetch(serverRoot(baseUrl) + path, {headers, cache: "no-store"});
    if (!response.ok) {
      throw new Error(`${path}: HTTP ${response.status}`);
    }
    return response.json();
  }

  start() {
    const tick = async () => {
      this.timer = null;
      if (el("auto-refresh").checked) {
        await this.refresh();
      }
      this.timer = setTimeout(tick, POLL_MS);
    };
    tick();
    el("refresh").addEventListener("click", () => this.refresh());
  }

  async refresh() {
    try {
      const [stats, recent] = await Promise.all([
        this.get("/engine/stats"), this.get("/engine/requests?limit=10"),
      ]);
      this.showStats(stats);
      this.showRecent(recent.data);
      el("server-status").textContent = "";
    } catch (error) {
      el("server-status").textContent =
        `No server view (${error.message}): needs a sluicegate server, and its admin key if it has one.`;
    }
  }

  showStats(stats) {
    el("stat-queued").textContent = String(stats.queued);
    el("stat-running").textContent = String(stats.running);
    el("stat-kv").textContent = `${stats.kv_cells_used} / ${stats.kv_cells_total}`;
    el("stat-aborted").textContent = String(stats.aborted_requests);
  }

  showRecent(rows) {
    const body = el("recent");
    body.replaceChildren(...rows.map((row) => {
      const tr = document.createElement("tr");
      const cells = [
        row.request_id, row.end_state, String(row.status),
        `${row.prompt_tokens} + ${row.completion_tokens}`,
        row.finish_reasons.map((r) => r || "none").join(", "),
      ];
      for (const text of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.append(td);
      }
      tr.dataset.endState = row.end_state;
      return tr;
    }));
  }

  // After Stop: poll until the ledger has the request's row and the engine no
  // longer runs any of its choices; report what the server says. responseId is
  // null when Stop came before the first chunk (no id known).
  async confirmAbort(responseId, n) {
    const report = el("abort-report");
    if (responseId === null) {
      report.textContent = "Stopped before the first chunk: no response id to look up; see Recent requests.";
      return;
    }
    report.textContent = `Stopped; asking the server about ${responseId}...`;
    const engineIds = Array.from({length: n}, (_, i) => `${responseId}-${i}`);
    const giveUp = performance.now() + CONFIRM_GIVE_UP_MS;
    for (;;) {
      let row = null;
      let stats = null;
      try {
        [row, stats] = await Promise.all([
          this.get(`/engine/requests?id=${encodeURIComponent(responseId)}`).then((r) => r.data[0] || null),
          this.get("/engine/stats"),
        ]);
      } catch (error) {
        report.textContent = `Stopped; the server cannot say more (${error.message}).`;
        return;
      }
      const running = engineIds.some((id) => stats.running_ids.includes(id));
      if ((row !== null && !running) || performance.now() > giveUp) {
        this.showStats(stats);
        report.textContent = abortReport(responseId, engineIds, row, stats, running);
        report.dataset.endState = row ? row.end_state : "";
        report.dataset.kvCellsUsed = String(stats.kv_cells_used);
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, CONFIRM_POLL_MS));
    }
  }
}

function abortReport(responseId, engineIds, row, stats, running) {
  const aborted = engineIds.filter((id) => stats.aborted_ids.includes(id));
  const ledger = row === null
    ? "no ledger row yet"
    : `ledger: ${row.end_state} (status ${row.status}, ${row.completion_tokens} completion tokens)`;
  const engine = running
    ? "engine: still running"
    : `engine: aborted ${aborted.length ? aborted.join(", ") : "nothing of it (it had ended)"}`;
  return `Server says: ${responseId} ${ledger}; ${engine}; ` +
    `KV cells used ${stats.kv_cells_used} / ${stats.kv_cells_total}, running ${stats.running}.`;
}
