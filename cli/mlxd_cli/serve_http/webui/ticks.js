// mlx-serve-http web UI: the scheduler live. Reads /ui/ticks/stream (SSE, four updates a second: the
// interval's ticks as compact rows, the last ticks whole, the daemon's status figures) and keeps the last
// WINDOW_S seconds for the plots.
"use strict";
(() => {
  const WINDOW_S = 30;
  const $ = (id) => document.getElementById(id);
  const ticks = []; // {t, batch, pipelined, steps, ms, tokens, drafted, accepted, prefill}
  const intervals = []; // {t, tokens, drafted, accepted, ticks, status}
  let peak = 0;
  let paused = false;
  let dirty = false;

  const colors = () => {
    const style = getComputedStyle(document.documentElement);
    return { ink: style.getPropertyValue("--muted").trim(), line: style.getPropertyValue("--line").trim() };
  };

  // Draws series of [t, value] points on a canvas over the last WINDOW_S seconds.
  function plot(canvas, series, options = {}) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (canvas.width !== width * ratio) canvas.width = width * ratio;
    if (canvas.height !== height * ratio) canvas.height = height * ratio;
    const g = canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, width, height);
    const { ink, line } = colors();
    const now = Date.now() / 1000;
    let top = options.max || 0;
    for (const s of series) for (const p of s.points) top = Math.max(top, p[1]);
    top = top > 0 ? top * 1.1 : 1;
    const left = 34;
    const x = (t) => left + ((t - (now - WINDOW_S)) / WINDOW_S) * (width - left - 4);
    const y = (v) => height - 14 - (v / top) * (height - 22);
    g.strokeStyle = line;
    g.fillStyle = ink;
    g.font = "10px ui-monospace, monospace";
    g.lineWidth = 1;
    for (const v of [0, top / 2, top / 1.1]) {
      g.beginPath();
      g.moveTo(left, y(v));
      g.lineTo(width, y(v));
      g.stroke();
      g.fillText(v >= 100 ? Math.round(v) : +v.toFixed(1), 2, y(v) + 3);
    }
    g.fillText("-" + WINDOW_S + " s", left, height - 2);
    g.fillText("now", width - 24, height - 2);
    for (const s of series) {
      if (s.dots) {
        for (const p of s.points) {
          g.fillStyle = s.color(p);
          g.fillRect(x(p[0]) - 1, y(p[1]) - 1, 3, 3);
        }
        continue;
      }
      g.strokeStyle = s.color;
      g.lineWidth = 1.5;
      g.beginPath();
      s.points.forEach((p, i) => (i ? g.lineTo(x(p[0]), y(p[1])) : g.moveTo(x(p[0]), y(p[1]))));
      g.stroke();
    }
  }

  const percent = (part, whole) => (whole ? (100 * part) / whole : 0);
  function kvPercent(kv) {
    if (!kv) return null;
    if (kv.blocks) return percent(kv.blocks_used, kv.blocks);
    if (kv.slots) return percent(kv.slots - kv.slots_free, kv.slots);
    return null;
  }
  function cachePercent(cache) {
    return cache && cache.budget_bytes ? percent(cache.bytes, cache.budget_bytes) : null;
  }

  function take(update) {
    const t = update.time;
    const columns = update.columns;
    const n = update.ticks.length;
    let tokens = 0;
    let drafted = 0;
    let accepted = 0;
    update.ticks.forEach((row, i) => {
      const tick = {};
      columns.forEach((name, j) => (tick[name] = row[j]));
      tick.t = t - update.interval_s + ((i + 1) / n) * update.interval_s; // spread over the interval
      tokens += tick.tokens;
      drafted += tick.drafted;
      accepted += tick.accepted;
      peak = Math.max(peak, tick.batch);
      ticks.push(tick);
    });
    intervals.push({ t, tokens, drafted, accepted, ticks: n, status: update.status, interval: update.interval_s });
    while (ticks.length && ticks[0].t < t - WINDOW_S) ticks.shift();
    while (intervals.length && intervals[0].t < t - WINDOW_S) intervals.shift();
    document.body.dataset.peakBatch = String(peak);
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    $("state").textContent = update.error ? "trace error: " + update.error : update.status && !update.status.up ? "daemon down" : "live";
    if (update.recent.length) showRecent(update.recent);
    dirty = true;
  }

  function showRecent(recent) {
    const body = $("recent");
    for (const tick of recent) {
      const tr = document.createElement("tr");
      const rows = tick.rows.map((r) => r.request + ":" + describe(r)).join(", ");
      const mode = tick.pipelined ? "pipelined" : "sync";
      for (const [text, cls] of [
        [tick.tick],
        [tick.batch],
        [mode + (tick.steps > 1 ? " x" + tick.steps : ""), mode],
        [tick.duration_ms.toFixed(2)],
        [tick.prefill_tokens || ""],
        [rows, "rows"],
      ]) {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        tr.append(td);
      }
      body.prepend(tr);
    }
    while (body.children.length > 20) body.lastElementChild.remove();
  }

  function describe(row) {
    if (row.action === "verify") return "verify " + (row.accepted || 0) + "/" + (row.drafted || 0) + (row.detail ? " (" + row.detail + ")" : "");
    if (row.action === "finished") return "finished:" + (row.detail || "");
    if (row.action === "decode") return "decode" + (row.detail ? "(" + row.detail + ")" : "") + (row.tokens ? " x" + row.tokens : "");
    return row.action;
  }

  function draw() {
    requestAnimationFrame(draw);
    if (!dirty || paused) return;
    dirty = false;
    const last = intervals.slice(-4); // the last second
    const seconds = last.reduce((sum, i) => sum + i.interval, 0) || 1;
    const sum = (key) => last.reduce((total, i) => total + i[key], 0);
    const recentTicks = ticks.filter((tick) => tick.t > intervals[intervals.length - 1].t - 1);
    const status = intervals.length ? intervals[intervals.length - 1].status : null;
    $("n-batch").textContent = recentTicks.length ? recentTicks[recentTicks.length - 1].batch : 0;
    $("n-peak").textContent = peak;
    $("n-mode").textContent = recentTicks.length ? Math.round(percent(recentTicks.filter((k) => k.pipelined).length, recentTicks.length)) + "%" : "–";
    $("n-tps").textContent = Math.round(sum("tokens") / seconds);
    $("n-accept").textContent = sum("drafted") ? Math.round(percent(sum("accepted"), sum("drafted"))) + "%" : "–";
    $("n-tickrate").textContent = Math.round(sum("ticks") / seconds);
    if (status) {
      $("n-queue").textContent = status.queued;
      $("n-active").textContent = status.active;
      const kv = kvPercent(status.kv);
      $("n-kv").textContent = kv == null ? "–" : Math.round(kv) + "%";
      const cache = status.prefix_cache;
      $("n-cache").textContent = cache ? cache.entries + " entries, " + cache.hits + "/" + cache.lookups + " hits" : "–";
    }
    const rate = (key) => intervals.map((i) => [i.t, i[key] / i.interval]);
    const withStatus = intervals.filter((i) => i.status);
    plot($("plot-batch"), [{ dots: true, points: ticks.map((k) => [k.t, k.batch, k.pipelined]), color: (p) => (p[2] ? "#2a9d4b" : "#c98a00") }], {
      max: status && status.max_batch,
    });
    plot($("plot-tps"), [{ color: "#2f6fde", points: rate("tokens") }]);
    plot($("plot-verify"), [
      { color: "#999", points: rate("drafted") },
      { color: "#2a9d4b", points: rate("accepted") },
    ]);
    plot($("plot-queue"), [
      { color: "#2f6fde", points: withStatus.map((i) => [i.t, i.status.active]) },
      { color: "#d33", points: withStatus.map((i) => [i.t, i.status.queued]) },
    ]);
    plot($("plot-memory"), [
      { color: "#2f6fde", points: withStatus.map((i) => [i.t, kvPercent(i.status.kv) || 0]) },
      { color: "#8a4fd8", points: withStatus.map((i) => [i.t, cachePercent(i.status.prefix_cache) || 0]) },
    ], { max: 100 });
    plot($("plot-ms"), [{ dots: true, points: ticks.map((k) => [k.t, k.duration_ms]), color: () => "#2f6fde" }]);
  }

  async function follow() {
    for (;;) {
      try {
        const response = await mlxdApi.request("/ui/ticks/stream" + location.search);
        if (!response.ok) throw new Error(await mlxdApi.errorText(response));
        $("state").textContent = "live";
        await mlxdApi.readEvents(response, (data) => take(JSON.parse(data)));
        $("state").textContent = "the feed ended; reconnecting…";
      } catch (error) {
        $("state").textContent = String(error.message || error) + "; retrying…";
      }
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }

  $("pause").addEventListener("click", () => {
    paused = !paused;
    $("pause").textContent = paused ? "Resume" : "Pause";
    dirty = true;
  });
  requestAnimationFrame(draw);
  follow();
})();
