// The chat tab: one conversation kept in the page and sent back whole as history, streamed
// over SSE with fetch, rendered as Markdown, with per-reply timings and routing details.

import { ApiError, call, getJSON, headers, sseBatches } from "./api.js";
import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);

export class Chat {
  constructor() {
    this.history = []; // {role, content} turns, without the system prompt
    this.controller = null; // AbortController of the request in flight
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      this.send();
    });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.send();
      }
    });
    $("stop").addEventListener("click", () => this.stop());
    $("new-chat").addEventListener("click", () => this.reset());
    // Settings start open where there is room for them beside the conversation.
    $("settings").open = window.matchMedia("(min-width: 760px)").matches;
  }

  async loadModels() {
    const select = $("model");
    const shown = $("models-error");
    try {
      const cards = (await getJSON("v1/models")).data || [];
      // Chat models first: LLM cards carry max_model_len, embedding models do not.
      const llms = cards.filter((c) => c.max_model_len !== undefined);
      const previous = select.value;
      select.replaceChildren(...(llms.length ? llms : cards).map((c) => new Option(c.id, c.id)));
      if ([...select.options].some((o) => o.value === previous)) select.value = previous;
      shown.hidden = true;
      return true;
    } catch (err) {
      shown.textContent = err.message;
      shown.hidden = false;
      return false;
    }
  }

  reset() {
    this.stop();
    this.history = [];
    $("messages").replaceChildren();
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  body() {
    const system = $("system").value.trim();
    const messages = system ? [{ role: "system", content: system }, ...this.history] : [...this.history];
    const body = {
      model: $("model").value,
      messages,
      stream: true,
      stream_options: { include_usage: true },
      temperature: Number($("temperature").value),
      max_tokens: Math.max(1, Math.floor(Number($("max-tokens").value) || 1)),
    };
    if ($("ignore-eos").checked) body.ignore_eos = true;
    return body;
  }

  async send() {
    const text = $("prompt").value.trim();
    if (!text || this.controller) return;
    $("prompt").value = "";
    this.history.push({ role: "user", content: text });
    bubble("user").querySelector(".content").textContent = text;
    const reply = new Reply(bubble("assistant"));
    this.controller = new AbortController();
    this.busy(true);
    try {
      await reply.stream(this.body(), this.controller.signal);
    } catch (err) {
      reply.fail(err);
    } finally {
      this.controller = null;
      this.busy(false);
    }
    if (reply.text) this.history.push({ role: "assistant", content: reply.text });
    else if (reply.error) this.history.pop(); // the turn never reached the model: resend it by hand
    reply.finish();
    $("prompt").focus();
  }

  busy(on) {
    $("send").disabled = on;
    $("stop").disabled = !on;
    document.body.classList.toggle("generating", on);
  }
}

function bubble(role) {
  const el = document.createElement("article");
  el.className = `message ${role}`;
  const content = document.createElement("div");
  content.className = "content";
  el.append(content);
  $("messages").append(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

// One assistant reply: its text as it streams, its timings, and how it ended.
class Reply {
  constructor(el) {
    this.el = el;
    this.content = el.querySelector(".content");
    this.text = "";
    this.deltas = 0; // content deltas seen: the token count when a stopped stream sent no usage
    this.usage = null;
    this.worker = null;
    this.finishReason = null;
    this.error = null;
    this.stopped = false;
    this.t0 = performance.now();
    this.tFirst = null;
    this.tLast = null;
    el.classList.add("streaming");
  }

  async stream(body, signal) {
    const resp = await call("v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal,
      headers: headers({ accept: "text/event-stream" }) });
    // Same-origin, so fetch may read every response header, the routing ones included.
    this.worker = resp.headers.get("x-sluice-worker");
    for await (const batch of sseBatches(resp)) {
      for (const data of batch) {
        if (data === "[DONE]") return;
        this.event(JSON.parse(data));
      }
      this.render();
    }
  }

  event(msg) {
    if (msg.error) throw new ApiError(msg.error.message || String(msg.error), 0, msg);
    if (msg.usage) this.usage = msg.usage;
    for (const choice of msg.choices || []) {
      const piece = choice.delta?.content;
      if (piece) {
        const now = performance.now();
        if (this.tFirst === null) this.tFirst = now;
        this.tLast = now;
        this.text += piece;
        this.deltas++;
      }
      if (choice.finish_reason) this.finishReason = choice.finish_reason;
    }
  }

  render() {
    this.content.innerHTML = renderMarkdown(this.text); // escaped first, see markdown.js
    this.el.scrollIntoView({ block: "end" });
  }

  fail(err) {
    if (err.name === "AbortError") {
      this.stopped = true;
    } else {
      this.error = err;
    }
  }

  finish() {
    this.render();
    this.el.classList.remove("streaming");
    this.el.classList.add(this.error ? "failed" : this.stopped ? "stopped" : "done");
    if (this.error) {
      const p = document.createElement("p");
      p.className = "error";
      p.setAttribute("role", "alert");
      p.textContent = this.error.message;
      this.el.append(p);
    }
    const stats = document.createElement("p");
    stats.className = "stats";
    stats.textContent = this.summary();
    this.el.append(stats);
  }

  summary() {
    const parts = [];
    if (this.tFirst !== null) parts.push(`TTFT ${((this.tFirst - this.t0) / 1000).toFixed(2)} s`);
    const tokens = this.usage?.completion_tokens ?? this.deltas;
    if (tokens > 1 && this.tLast > this.tFirst) {
      parts.push(`${((tokens - 1) / ((this.tLast - this.tFirst) / 1000)).toFixed(1)} tok/s`);
    }
    if (this.usage) {
      const cached = this.usage.prompt_tokens_details?.cached_tokens;
      parts.push(`cached ${cached ?? "–"}/${this.usage.prompt_tokens} prompt tokens`);
    }
    parts.push(`${tokens} tokens`);
    if (this.worker) parts.push(`worker ${this.worker}`);
    if (this.stopped) parts.push("stopped");
    else if (this.finishReason) parts.push(`finish: ${this.finishReason}`);
    return parts.join(" · ");
  }
}
