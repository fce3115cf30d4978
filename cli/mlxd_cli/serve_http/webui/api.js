// mlx-serve-http web UI: requests to this server (the API key, SSE reading), shared by both pages.
// With --api-key the server serves the page with <meta name="mlxd-api-key" content="required">: the page
// asks for the key before its first request and keeps it in sessionStorage (gone when the tab closes);
// every request carries it. A refused key (401) is asked for again.
"use strict";
const mlxdApi = (() => {
  const KEY = "mlxd-api-key";
  const meta = document.querySelector('meta[name="mlxd-api-key"]');
  const keyRequired = meta !== null && meta.content === "required";
  let asking = null; // one dialog at a time, however many requests wait for it

  function askForKey() {
    if (asking) return asking;
    const dialog = document.getElementById("key-dialog");
    const input = document.getElementById("key-input");
    asking = new Promise((resolve) => {
      dialog.addEventListener("close", function done() {
        dialog.removeEventListener("close", done);
        sessionStorage.setItem(KEY, input.value.trim());
        input.value = "";
        asking = null;
        resolve();
      });
    });
    dialog.showModal();
    return asking;
  }

  // fetch() with the API key: asked for first when the server needs one and the tab has none; a 401 (a
  // wrong key, or a server restarted with --api-key under an open page) asks again and tries again.
  async function request(path, options = {}) {
    while (keyRequired && !sessionStorage.getItem(KEY)) await askForKey();
    for (;;) {
      const headers = Object.assign({}, options.headers || {});
      const key = sessionStorage.getItem(KEY);
      if (key) headers.Authorization = "Bearer " + key;
      const response = await fetch(path, Object.assign({}, options, { headers }));
      if (response.status !== 401) return response;
      await askForKey();
    }
  }

  // The error message of a refused request (the server's JSON error body, else the status line).
  async function errorText(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || JSON.stringify(body);
    } catch (e) {
      return response.status + " " + response.statusText;
    }
  }

  // Calls onData(text) with every SSE "data:" payload of a streamed response, in order.
  async function readEvents(response, onData) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = event.split("\n").filter((line) => line.startsWith("data:")).map((line) => line.slice(5).replace(/^ /, ""));
        if (data.length) onData(data.join("\n"));
      }
    }
  }

  return { request, errorText, readEvents };
})();
