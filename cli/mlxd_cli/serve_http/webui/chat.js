// mlx-serve-http web UI: the chat page. Conversations live in localStorage ("mlxd-chat"): each has its
// messages and its settings (system prompt, sampling, prompt lookup). Replies stream from
// /v1/chat/completions (SSE); the last chunks carry the timings and usage shown under each reply.
"use strict";
(() => {
  const STORE = "mlxd-chat";
  const $ = (id) => document.getElementById(id);
  const state = load();
  let running = null; // {controller, conversation} while a reply streams

  function load() {
    try {
      const saved = JSON.parse(localStorage.getItem(STORE));
      if (saved && Array.isArray(saved.conversations)) return saved;
    } catch (e) {
      /* unreadable: start again */
    }
    return { conversations: [], current: null };
  }
  const save = () => localStorage.setItem(STORE, JSON.stringify(state));
  const current = () => state.conversations.find((c) => c.id === state.current);

  function newConversation() {
    const previous = current();
    const conversation = {
      id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6),
      title: "New chat",
      named: false,
      messages: [],
      settings: previous ? Object.assign({}, previous.settings) : { system: "", temperature: "", top_p: "", max_tokens: "", prompt_lookup: true },
    };
    state.conversations.unshift(conversation);
    state.current = conversation.id;
    save();
    render();
  }

  // ---- drawing -------------------------------------------------------------------------------
  function render() {
    const list = $("conversations");
    list.replaceChildren();
    for (const c of state.conversations) {
      const item = document.createElement("li");
      item.className = c.id === state.current ? "active" : "";
      item.dataset.id = c.id;
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = c.title;
      const rename = button("rename", "✎", "Rename");
      const remove = button("delete", "×", "Delete");
      item.append(name, rename, remove);
      list.append(item);
    }
    const c = current();
    $("title").textContent = c ? c.title : "";
    for (const field of ["system", "temperature", "top_p", "max_tokens"]) $(field).value = c ? c.settings[field] : "";
    $("prompt_lookup").checked = c ? c.settings.prompt_lookup : true;
    const messages = $("messages");
    messages.replaceChildren();
    if (c) for (const m of c.messages) messages.append(messageElement(m));
    messages.scrollTop = messages.scrollHeight;
  }

  function button(cls, text, title) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = cls;
    b.textContent = text;
    b.title = title;
    return b;
  }

  function messageElement(m) {
    const box = document.createElement("div");
    box.className = "message " + m.role;
    const body = document.createElement("div");
    body.className = "body";
    fillBody(body, m);
    const foot = document.createElement("div");
    foot.className = "foot";
    const stats = document.createElement("span");
    stats.className = "stats";
    stats.textContent = statsText(m);
    foot.append(stats, button("copy", "copy", "Copy this message"));
    box.append(body, foot);
    return box;
  }

  function fillBody(body, m) {
    if (m.role === "assistant") body.innerHTML = mlxdMarkdown.render(m.content); // escaped by the renderer
    else body.textContent = m.content;
    if (m.error) {
      const error = document.createElement("div");
      error.className = "error";
      error.textContent = m.error;
      body.append(error);
    }
  }

  // "12.3 tok/s · TTFT 45 ms · 10 cached · drafts 5/8 accepted" from the reply's timings and usage.
  function statsText(m) {
    const s = m.stats;
    if (!s) return m.stopped ? "stopped" : "";
    const parts = [];
    if (s.tokens != null) parts.push(s.tokens + " tokens");
    if (s.tps != null) parts.push(s.tps.toFixed(1) + " tok/s");
    if (s.ttft_ms != null) parts.push("TTFT " + Math.round(s.ttft_ms) + " ms");
    parts.push((s.cached || 0) + " cached");
    if (s.draft_n != null) parts.push("drafts " + s.draft_accepted + "/" + s.draft_n + " accepted");
    if (m.stopped) parts.push("stopped");
    return parts.join(" · ");
  }

  function stats(timings, usage, clientTtft) {
    const t = timings || {};
    const cached = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : t.cache_n;
    return {
      tokens: usage ? usage.completion_tokens : t.predicted_n,
      tps: t.predicted_per_second || null,
      ttft_ms: t.prompt_ms != null ? (t.queue_ms || 0) + t.prompt_ms : clientTtft,
      cached: cached || 0,
      draft_n: t.draft_n != null ? t.draft_n : null,
      draft_accepted: t.draft_n_accepted || 0,
    };
  }

  // ---- sending -------------------------------------------------------------------------------
  function requestBody(c) {
    const s = c.settings;
    const messages = [];
    if (s.system.trim()) messages.push({ role: "system", content: s.system });
    for (const m of c.messages) if (!m.error && m.content) messages.push({ role: m.role, content: m.content });
    const body = {
      messages,
      stream: true,
      stream_options: { include_usage: true },
      speculative: { kind: s.prompt_lookup ? "prompt-lookup" : "none" },
    };
    for (const [field, parse] of [["temperature", parseFloat], ["top_p", parseFloat], ["max_tokens", parseInt]]) {
      const value = parse(s[field]);
      if (!Number.isNaN(value)) body[field] = value;
    }
    return body;
  }

  async function send(text) {
    let c = current();
    if (!c) {
      newConversation();
      c = current();
    }
    c.messages.push({ role: "user", content: text });
    if (!c.named) c.title = text.slice(0, 40) || "New chat";
    const reply = { role: "assistant", content: "" };
    const body = requestBody(c);
    c.messages.push(reply);
    save();
    render();
    const box = $("messages").lastElementChild;
    const replyBody = box.querySelector(".body");
    const controller = new AbortController();
    running = { controller, conversation: c };
    setRunning(true);
    const started = performance.now();
    let clientTtft = null;
    let timings = null;
    let usage = null;
    let drawing = false;
    const draw = () => {
      if (drawing) return;
      drawing = true;
      requestAnimationFrame(() => {
        drawing = false;
        fillBody(replyBody, reply);
        $("messages").scrollTop = $("messages").scrollHeight;
      });
    };
    try {
      const response = await mlxdApi.request("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) throw new Error(await mlxdApi.errorText(response));
      await mlxdApi.readEvents(response, (data) => {
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the server failed");
        if (chunk.timings) timings = chunk.timings;
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices && chunk.choices[0];
        const delta = choice && choice.delta && choice.delta.content;
        if (delta) {
          if (clientTtft == null) clientTtft = performance.now() - started;
          reply.content += delta;
          draw();
        }
      });
      reply.stats = stats(timings, usage, clientTtft);
    } catch (error) {
      if (error.name === "AbortError") reply.stopped = true;
      else reply.error = String(error.message || error);
    } finally {
      running = null;
      setRunning(false);
      save();
      if (current() === c) render();
    }
  }

  function setRunning(on) {
    $("send").hidden = on;
    $("stop").hidden = !on;
    $("input").disabled = on;
    if (!on) $("input").focus();
  }

  async function copy(text) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (e) {
      const area = document.createElement("textarea"); // not a secure context: the old way
      area.value = text;
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
  }

  function flash(b, text) {
    const old = b.textContent;
    b.textContent = text;
    setTimeout(() => (b.textContent = old), 1200);
  }

  // ---- events --------------------------------------------------------------------------------
  $("new-chat").addEventListener("click", () => {
    if (!running) newConversation();
  });
  $("conversations").addEventListener("click", (event) => {
    const item = event.target.closest("li");
    if (!item || running) return;
    const c = state.conversations.find((x) => x.id === item.dataset.id);
    if (event.target.classList.contains("rename")) {
      const title = prompt("Rename conversation", c.title);
      if (title && title.trim()) {
        c.title = title.trim().slice(0, 80);
        c.named = true;
      }
    } else if (event.target.classList.contains("delete")) {
      if (!confirm("Delete \u201c" + c.title + "\u201d?")) return;
      state.conversations = state.conversations.filter((x) => x !== c);
      if (state.current === c.id) state.current = state.conversations.length ? state.conversations[0].id : null;
    } else {
      state.current = c.id;
    }
    save();
    render();
  });
  $("settings-toggle").addEventListener("click", () => {
    const open = $("settings").hidden;
    $("settings").hidden = !open;
    $("settings-toggle").setAttribute("aria-expanded", String(open));
  });
  for (const field of ["system", "temperature", "top_p", "max_tokens", "prompt_lookup"]) {
    $(field).addEventListener("change", () => {
      const value = field === "prompt_lookup" ? $(field).checked : $(field).value;
      if (!current()) newConversation(); // redraws the fields: the value was read first
      current().settings[field] = value;
      save();
      render();
    });
  }
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("input").value.trim();
    if (!text || running) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => running && running.controller.abort());
  $("messages").addEventListener("click", (event) => {
    const target = event.target;
    if (target.classList.contains("copy-code")) {
      copy(target.closest(".code").querySelector("code").textContent).then(() => flash(target, "copied"));
    } else if (target.classList.contains("copy")) {
      const index = Array.from($("messages").children).indexOf(target.closest(".message"));
      copy(current().messages[index].content).then(() => flash(target, "copied"));
    }
  });

  // The model's name (and, with --api-key, the key: asked for here, before anything is typed).
  mlxdApi
    .request("/v1/models")
    .then(async (response) => {
      const models = response.ok ? await response.json() : {};
      if (models.data && models.data.length) $("model").textContent = models.data[0].id;
    })
    .finally(() => (document.body.dataset.ready = "1"));
  render();
})();
