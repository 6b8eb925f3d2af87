// torch-xdna chat page: plain JavaScript, no dependencies, no CDN. It uses only the public API:
// GET v1/models (the picker), POST v1/chat/completions with "stream": true (server-sent events),
// POST v1/audio/transcriptions (when a Whisper model is served). Model output is inserted as
// text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "torch-xdna.api-key";      // sessionStorage: forgotten when the tab closes
const MODEL_STORE = "torch-xdna.model";
const state = { messages: [], controller: null, asr: null };

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function headers(json) {
  const h = json ? { "Content-Type": "application/json" } : {};
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    const err = body.error;
    return (err && (err.message || err)) || resp.status + " " + resp.statusText;
  } catch (e) {
    return resp.status + " " + resp.statusText;
  }
}

function needKey() {
  $("settings").open = true;
  $("api-key").focus();
  setStatus("This server needs an API key: enter it under Settings.", true);
}

async function loadModels() {
  let resp;
  try {
    resp = await fetch("v1/models", { headers: headers(false) });
  } catch (e) {
    setStatus("Cannot reach the server: " + e.message, true);
    return;
  }
  if (resp.status === 401) return needKey();
  if (!resp.ok) return setStatus(await errorText(resp), true);
  const models = (await resp.json()).data || [];
  const chat = models.filter((m) => m.kind === undefined || m.kind === "chat");
  const asr = models.filter((m) => m.kind === "asr");
  const select = $("model");
  const wanted = select.value || sessionStorage.getItem(MODEL_STORE);
  select.replaceChildren(...chat.map((m) => new Option(m.id, m.id)));
  if (chat.some((m) => m.id === wanted)) select.value = wanted;
  state.asr = asr.length ? asr[0].id : null;
  $("audio-label").hidden = !state.asr;
  $("send").disabled = !chat.length;
  setStatus(chat.length ? "" : "No chat model is served: start xdna serve with " +
            "--model DIR (a decoder directory or GGUF file).", !chat.length);
  document.body.dataset.ready = "1";
}

function bubble(role) {
  const el = document.createElement("div");
  el.className = "msg " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  const thinking = document.createElement("details");
  thinking.className = "thinking";
  thinking.hidden = true;
  const summary = document.createElement("summary");
  summary.textContent = "thinking";
  const thought = document.createElement("div");
  thinking.append(summary, thought);
  const content = document.createElement("div");
  content.className = "content";
  const meta = document.createElement("span");
  meta.className = "meta";
  el.append(label, thinking, content, meta);
  $("messages").append(el);
  return { el, thinking, thought, content, meta, chunks: 0 };
}

function requestBody(model) {
  const system = $("system").value.trim();
  const messages = (system ? [{ role: "system", content: system }] : []).concat(state.messages);
  const body = { model, messages, stream: true, stream_options: { include_usage: true } };
  const temperature = $("temperature").value;
  if (temperature !== "") body.temperature = Number(temperature);
  const maxTokens = $("max-tokens").value;
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  if (!$("thinking").checked) body.chat_template_kwargs = { enable_thinking: false };
  return body;
}

// Reads an SSE body; calls onChunk(parsed JSON) for every "data:" line but [DONE].
async function readEvents(resp, onChunk) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data && data !== "[DONE]") onChunk(JSON.parse(data));
      }
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy || !$("model").value;
  $("stop").hidden = !busy;
}

async function send() {
  const text = $("input").value;
  const model = $("model").value;
  if (!text.trim() || state.controller) return;
  if (!model) return setStatus("Pick a model first.", true);
  $("input").value = "";
  setStatus("");
  state.messages.push({ role: "user", content: text });
  bubble("user").content.textContent = text;
  const out = bubble("assistant");
  const body = requestBody(model);
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  let content = "", reasoning = "", usage = null, finish = null;
  const t0 = performance.now();
  try {
    const resp = await fetch("v1/chat/completions", { method: "POST", headers: headers(true),
                                                      body: JSON.stringify(body),
                                                      signal: controller.signal });
    if (resp.status === 401) needKey();
    if (!resp.ok) throw new Error(await errorText(resp));
    await readEvents(resp, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || String(chunk.error));
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (delta.reasoning_content) {
          reasoning += delta.reasoning_content;
          out.thinking.hidden = false;
          out.thought.textContent = reasoning;
        }
        if (delta.content) {
          content += delta.content;
          out.content.textContent = content;
          out.el.dataset.chunks = String(++out.chunks);
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    });
    state.messages.push({ role: "assistant", content });
    const secs = ((performance.now() - t0) / 1000).toFixed(1);
    const tokens = usage ? usage.completion_tokens + " tokens, " : "";
    out.meta.textContent = tokens + secs + " s" +
        (finish === "length" ? " (stopped at the max tokens)" : "");
  } catch (e) {
    if (e.name === "AbortError") {
      state.messages.push({ role: "assistant", content });
      out.meta.textContent = "stopped";
    } else {                      // the turn failed: drop it, give the text back to retry
      controller.abort();
      state.messages.pop();
      out.el.classList.add("error");
      out.meta.textContent = "error: " + e.message;
      $("input").value = text;
      setStatus(e.message, true);
    }
  } finally {
    state.controller = null;
    out.el.dataset.done = "1";
    setBusy(false);
  }
}

async function transcribe(file) {
  const form = new FormData();
  form.append("file", file);
  form.append("model", state.asr);
  setStatus("Transcribing " + file.name + " ...");
  try {
    const resp = await fetch("v1/audio/transcriptions", { method: "POST", headers: headers(false),
                                                          body: form });
    if (!resp.ok) throw new Error(await errorText(resp));
    const text = (await resp.json()).text.trim();
    $("input").value = ($("input").value ? $("input").value + " " : "") + text;
    setStatus("");
  } catch (e) {
    setStatus("Transcription failed: " + e.message, true);
  } finally {
    document.body.dataset.transcribed = String(Number(document.body.dataset.transcribed || 0) + 1);
  }
}

$("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
});
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("new-chat").addEventListener("click", () => {
  if (state.controller) state.controller.abort();
  state.messages = [];
  $("messages").replaceChildren();
  setStatus("");
});
$("model").addEventListener("change", () => sessionStorage.setItem(MODEL_STORE, $("model").value));
$("api-key").value = sessionStorage.getItem(KEY_STORE) || "";
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem(KEY_STORE, $("api-key").value.trim());
  loadModels();
});
$("audio").addEventListener("change", () => {
  const file = $("audio").files[0];
  $("audio").value = "";
  if (file) transcribe(file);
});
loadModels();
