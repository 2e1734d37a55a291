// Homerack's web chat for this home's paired devices. The model's words are untrusted:
// they become DOM text nodes, never HTML; links keep only http(s) targets; no image is
// loaded from anywhere but this page (the CSP says so too).
"use strict";
const $ = (id) => document.getElementById(id);
const state = { conv: null, models: [], picture: null, following: null };

async function api(path, options = {}) {
  const init = { credentials: "same-origin", ...options };
  if (options.body !== undefined) {
    init.headers = { "Content-Type": "application/json" };
    init.body = JSON.stringify(options.body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) { showPairing(); throw new Error("not paired"); }
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}
const json = async (path, options) => (await api(path, options)).json();

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v; else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

// ---- Markdown, as DOM nodes --------------------------------------------------------
const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\n]+\*)|(!?\[[^\]\n]*\]\([^)\s]*\))/;

function inline(text) {
  const out = [];
  let rest = text;
  while (rest) {
    const m = rest.match(INLINE);
    if (!m) { out.push(document.createTextNode(rest)); break; }
    if (m.index) out.push(document.createTextNode(rest.slice(0, m.index)));
    const token = m[0];
    if (m[1]) out.push(el("code", { text: token.slice(1, -1) }));
    else if (m[2]) out.push(el("strong", {}, ...inline(token.slice(2, -2))));
    else if (m[3]) out.push(el("em", {}, ...inline(token.slice(1, -1))));
    else out.push(link(token));
    rest = rest.slice(m.index + token.length);
  }
  return out;
}

function link(token) {
  const image = token.startsWith("!");
  const label = token.slice(image ? 2 : 1, token.indexOf("]("));
  const target = token.slice(token.indexOf("](") + 2, -1);
  let url = null;
  try { url = new URL(target); } catch (e) { /* relative or not a URL */ }
  if (image || !url || !["http:", "https:"].includes(url.protocol)) {
    return document.createTextNode(image ? `[image: ${label}]` : label || target);
  }
  return el("a", { href: url.href, rel: "noopener noreferrer nofollow", target: "_blank",
                   text: label || url.href });
}

function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const area = el("textarea", { class: "visually-hidden", readonly: "" });
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");  // a LAN page over http has no Clipboard API
  area.remove();
  return Promise.resolve();
}

function codeBlock(code, lang) {
  const button = el("button", { class: "small", type: "button", text: "Copy",
                                "aria-label": "Copy the code" });
  button.addEventListener("click", () => copyText(code).then(() => {
    button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1500);
  }));
  const block = document.createDocumentFragment();
  block.append(el("div", { class: "code-head" }, el("span", { text: lang || "code" }), button),
               el("pre", {}, el("code", { class: lang ? `language-${lang}` : "", text: code })));
  return block;
}

function markdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.split("\n");
  let list = null, para = [];
  const flush = () => {
    if (para.length) { out.append(el("p", {}, ...inline(para.join(" ")))); para = []; }
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+-]*)/);
    if (fence) {
      flush(); list = null;
      const code = [];
      while (++i < lines.length && !/^\s*```/.test(lines[i])) code.push(lines[i]);
      out.append(codeBlock(code.join("\n"), fence[1]));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)/);
    const item = line.match(/^\s*(?:[-*+]|(\d+)[.)])\s+(.*)/);
    if (heading) {
      flush(); list = null;
      out.append(el(`h${Math.min(6, heading[1].length + 2)}`, {}, ...inline(heading[2])));
    } else if (item) {
      flush();
      const kind = item[1] ? "ol" : "ul";
      if (!list || list.tagName.toLowerCase() !== kind) { list = el(kind); out.append(list); }
      list.append(el("li", {}, ...inline(item[2])));
    } else if (!line.trim()) {
      flush(); list = null;
    } else {
      list = null; para.push(line);
    }
  }
  flush();
  return out;
}

// ---- Messages -----------------------------------------------------------------------
function messageNode(m) {
  const node = el("article", { class: `msg ${m.role}`,
                               "aria-label": m.role === "user" ? "You" : "Answer" });
  fillMessage(node, m);
  return node;
}

function fillMessage(node, m) {
  node.replaceChildren();
  if (m.picture) node.append(el("img", { class: "picture", src: m.picture, alt: "Your picture" }));
  if (m.reasoning) {
    const details = el("details", {}, el("summary", { text: "Thinking" }));
    details.append(el("div", { text: m.reasoning }));
    node.append(details);
  }
  if (m.role === "user") node.append(el("p", { text: m.content }));
  else node.append(markdown(m.content || ""));
  for (const note of m.notes || []) node.append(el("p", { class: "note", text: note }));
  if (m.finish && !["stop", "length"].includes(m.finish)) {
    node.append(el("p", { class: "ended", text: m.finish === "cancelled" ? "Stopped." :
                                              `Ended: ${m.error || m.finish}` }));
  }
  if (m.role === "assistant" && m.content && m.finish) {
    node.append(el("button", { type: "button", class: "small read", text: "Read aloud",
                               onclick: () => readAloud(m.content) }));
  }
}

function render(conv) {
  $("title").textContent = conv.title;
  $("log").replaceChildren(...conv.messages.filter((m) => m.role !== "assistant" || m.content ||
                                                      m.reasoning || m.finish)
                                         .map(messageNode));
  $("log").scrollTop = $("log").scrollHeight;
}

async function follow(response, conv) {
  // the answer's events into its message, as they come
  const m = { role: "assistant", content: "", reasoning: "" };
  const node = messageNode(m);
  $("log").append(node);
  busy(true);
  let drawn = 0;  // the message is drawn again at most every 50 ms, not per token
  const redraw = () => {
    if (Date.now() - drawn < 50) return;
    drawn = Date.now();
    fillMessage(node, m);
    $("log").scrollTop = $("log").scrollHeight;
  };
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).replace(/^data: /, "");
        buffer = buffer.slice(cut + 2);
        const event = JSON.parse(line);
        if (event.type === "text") m.content += event.text;
        else if (event.type === "reasoning") m.reasoning += event.text;
        else if (event.type === "note") m.notes = [...(m.notes || []), event.text];
        else if (event.type === "done") { m.finish = event.finish; m.error = event.error; }
        redraw();
      }
    }
  } finally {
    busy(false);
    fillMessage(node, m);
  }
  if (conv && conv.id === state.conv) listConversations();
}

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
}

// ---- Conversations ------------------------------------------------------------------
async function listConversations() {
  const { data } = await json("/home/api/conversations");
  $("conversations").replaceChildren(...data.map((c) => {
    const open = el("button", { class: "open", type: "button", text: c.title,
                                onclick: () => { openConversation(c.id); toggleDrawer(false); } });
    const rename = el("button", { class: "small", type: "button", "aria-label": `Rename ${c.title}`,
                                  text: "Rename", onclick: () => renameConversation(c) });
    const remove = el("button", { class: "small", type: "button", "aria-label": `Delete ${c.title}`,
                                  text: "Delete", onclick: () => deleteConversation(c) });
    return el("li", { class: c.id === state.conv ? "current" : "" }, open, rename, remove);
  }));
  return data;
}

async function openConversation(id) {
  state.conv = id;
  const conv = await json(`/home/api/conversations/${id}`);
  if (conv.model && state.models.some((m) => m.id === conv.model)) $("model").value = conv.model;
  render(conv);
  if (conv.replying) {
    const last = $("log").lastElementChild;
    if (last && last.classList.contains("assistant")) last.remove();
    follow(await api(`/home/api/conversations/${id}/reply`), conv);
  }
  listConversations();
}

async function newConversation() {
  const conv = await json("/home/api/conversations", { method: "POST", body: {} });
  state.conv = conv.id;
  render({ ...conv, messages: [] });
  await listConversations();
  $("input").focus();
}

async function renameConversation(c) {
  const title = prompt("Rename the conversation", c.title);
  if (!title) return;
  await json(`/home/api/conversations/${c.id}`, { method: "PATCH", body: { title } });
  if (c.id === state.conv) $("title").textContent = title;
  listConversations();
}

async function deleteConversation(c) {
  if (!confirm(`Delete “${c.title}”?`)) return;
  await json(`/home/api/conversations/${c.id}`, { method: "DELETE" });
  if (c.id === state.conv) { state.conv = null; render({ title: "New chat", messages: [] }); }
  listConversations();
}

function toggleDrawer(open) {
  $("drawer").hidden = !open;
  $("menu").setAttribute("aria-expanded", String(open));
}

// ---- Sending ------------------------------------------------------------------------
async function send(event) {
  event.preventDefault();
  const content = $("input").value;
  if (!content.trim() && !state.picture) return;
  $("chat-error").textContent = "";
  try {
    if (!state.conv) await newConversation();
    const picture = state.picture;
    if (!$("log").children.length && content.trim()) $("title").textContent = content.slice(0, 60);
    $("log").append(messageNode({ role: "user", content, picture }));
    $("input").value = "";
    clearPicture();
    const conv = { id: state.conv };
    const response = await api(`/home/api/conversations/${state.conv}/messages`, {
      method: "POST", body: { content, model: $("model").value || null, picture } });
    await follow(response, conv);
  } catch (error) {
    $("chat-error").textContent = error.message;
  }
}

async function stop() {
  if (state.conv) await api(`/home/api/conversations/${state.conv}/stop`, { method: "POST", body: {} });
}

function choosePicture() {
  const file = $("picture").files[0];
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => {
    state.picture = reader.result;
    $("attached-img").src = reader.result;
    $("attached").hidden = false;
  };
  reader.readAsDataURL(file);
}

function clearPicture() {
  state.picture = null;
  $("picture").value = "";
  $("attached").hidden = true;
}

function showVision() {
  const model = state.models.find((m) => m.id === $("model").value);
  $("attach-label").hidden = !(model && model.vision);
}

// ---- Voice: the engine's speech models (/v1/audio/*) --------------------------------
// A phone reaches this page over plain HTTP on the LAN, where browsers give no microphone
// to a page; there the Speak button opens the phone's own recorder (a file input with
// `capture`). Where the page may record (a secure context: this computer), it records.
const recorder = { media: null, chunks: [] };

async function speak() {
  if (recorder.media) { recorder.media.stop(); return; }
  if (!(window.isSecureContext && navigator.mediaDevices && window.MediaRecorder)) {
    $("recording").click();
    return;
  }
  let stream;
  try { stream = await navigator.mediaDevices.getUserMedia({ audio: true }); } catch (e) {
    $("recording").click();  // refused, or no microphone: a recording from the phone
    return;
  }
  recorder.chunks = [];
  recorder.media = new MediaRecorder(stream);
  recorder.media.ondataavailable = (e) => recorder.chunks.push(e.data);
  recorder.media.onstop = () => {
    stream.getTracks().forEach((t) => t.stop());
    const type = recorder.media.mimeType || "audio/webm";
    recorder.media = null;
    speaking(false);
    transcribe(new Blob(recorder.chunks, { type }), type.includes("ogg") ? "speech.ogg" : "speech.webm");
  };
  recorder.media.start();
  speaking(true);
}

function speaking(on) {
  $("speak").setAttribute("aria-pressed", String(on));
  $("speak").classList.toggle("on", on);
}

async function transcribe(blob, name) {
  $("chat-error").textContent = "";
  const form = new FormData();
  form.append("file", blob, name);
  form.append("model", "whisper-1");
  $("speak").disabled = true;
  try {
    const response = await fetch("/v1/audio/transcriptions", {  // the page's own mark:
      method: "POST", body: form, credentials: "same-origin",    // no form can send it
      headers: { "X-Homerack-Page": "1" } });
    if (response.status === 401) { showPairing(); return; }
    const got = await response.json();
    if (!response.ok) throw new Error(got.error ? got.error.message : response.statusText);
    const before = $("input").value.trimEnd();
    $("input").value = before ? `${before} ${got.text}` : got.text;
    $("input").focus();
  } catch (error) {
    $("chat-error").textContent = `What was said could not be recognised: ${error.message}`;
  } finally {
    $("speak").disabled = false;
  }
}

function recorded() {
  const file = $("recording").files[0];
  $("recording").value = "";
  if (file) transcribe(file, file.name || "speech.m4a");
}

async function readAloud(text) {
  $("chat-error").textContent = "";
  try {
    const response = await api("/v1/audio/speech", { method: "POST",
      body: { model: "tts-1", voice: "alloy", input: text.slice(0, 4096), response_format: "wav" } });
    const voice = $("voice");
    if (voice.src) URL.revokeObjectURL(voice.src);
    voice.src = URL.createObjectURL(await response.blob());
    await voice.play();
  } catch (error) {
    $("chat-error").textContent = `It could not be read aloud: ${error.message}`;
  }
}

// ---- Pairing and start --------------------------------------------------------------
function showPairing() {
  $("chat").hidden = true;
  $("pair").hidden = false;
  $("code").focus();
}

async function pair(event) {
  event.preventDefault();
  $("pair-error").textContent = "";
  const response = await fetch("/pair", { method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code: $("code").value.trim() }) });
  if (!response.ok) {
    let message = "Pairing failed";
    try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
    $("pair-error").textContent = message;
    return;
  }
  start();
}

async function start() {
  let me;
  try { me = await json("/home/api/me"); } catch (e) { return; }
  $("pair").hidden = true;
  $("chat").hidden = false;
  state.models = me.models;
  $("model").replaceChildren(...me.models.map((m) => el("option", { value: m.id, text: m.id })));
  if (me.default) $("model").value = me.default;
  showVision();
  const conversations = await listConversations();
  if (conversations.length) await openConversation(conversations[0].id);
}

document.addEventListener("DOMContentLoaded", () => {
  $("pair-form").addEventListener("submit", pair);
  $("composer").addEventListener("submit", send);
  $("stop").addEventListener("click", stop);
  $("new").addEventListener("click", newConversation);
  $("menu").addEventListener("click", () => toggleDrawer($("drawer").hidden));
  $("picture").addEventListener("change", choosePicture);
  $("speak").addEventListener("click", speak);
  $("recording").addEventListener("change", recorded);
  $("unattach").addEventListener("click", clearPicture);
  $("model").addEventListener("change", showVision);
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && matchMedia("(pointer: fine)").matches) {
      send(e);
    }
  });
  // a phone that slept: the answer went on without the page; show it as it is now
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && state.conv && $("stop").hidden) {
      openConversation(state.conv);
    }
  });
  start();
});
