// mlx-serve-http web UI: a small Markdown renderer for replies. Safe by construction: every piece of the
// reply's text is HTML-escaped before any markup is added, links keep only http(s) targets, and the
// result holds no attributes taken from the text but an escaped href.
"use strict";
const mlxdMarkdown = (() => {
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escape = (text) => text.replace(/[&<>"']/g, (c) => ESCAPES[c]);

  // Inline markup of one escaped line: code spans first (their content is left alone), then links,
  // bold and italics in what lies between them.
  function inline(escaped) {
    return escaped
      .split(/(`[^`]+`)/)
      .map((part, i) => {
        if (i % 2) return "<code>" + part.slice(1, -1) + "</code>";
        return part
          .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>')
          .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
          .replace(/(^|[^*\w])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>");
      })
      .join("");
  }

  // Block markup of text with no code fences: headings, lists, quotes, paragraphs.
  function blocks(text) {
    const out = [];
    let list = null; // "ul" or "ol" while inside a list
    let paragraph = [];
    const flush = () => {
      if (paragraph.length) out.push("<p>" + paragraph.map(inline).join("<br>") + "</p>");
      paragraph = [];
    };
    const closeList = () => {
      if (list) out.push("</" + list + ">");
      list = null;
    };
    for (const raw of text.split("\n")) {
      const line = escape(raw);
      let m;
      if (!line.trim()) {
        flush();
        closeList();
      } else if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
        flush();
        closeList();
        out.push("<h" + m[1].length + ">" + inline(m[2]) + "</h" + m[1].length + ">");
      } else if ((m = /^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/.exec(line))) {
        flush();
        const kind = m[1] ? "ol" : "ul";
        if (list !== kind) {
          closeList();
          out.push("<" + kind + ">");
          list = kind;
        }
        out.push("<li>" + inline(m[2]) + "</li>");
      } else if ((m = /^&gt;\s?(.*)$/.exec(line))) {
        flush();
        closeList();
        out.push("<blockquote>" + inline(m[1]) + "</blockquote>");
      } else {
        closeList();
        paragraph.push(line);
      }
    }
    flush();
    closeList();
    return out.join("");
  }

  // The reply as HTML: fenced code blocks (```lang ... ```, an unclosed one runs to the end, as a
  // streamed reply has it) become <pre><code> with a copy button; the rest goes through blocks().
  function render(text) {
    const parts = text.split(/^```/m);
    let html = blocks(parts[0]);
    for (let i = 1; i < parts.length; i += 2) {
      const newline = parts[i].indexOf("\n");
      const language = newline < 0 ? parts[i] : parts[i].slice(0, newline);
      const code = newline < 0 ? "" : parts[i].slice(newline + 1).replace(/\n$/, "");
      const label = escape(language.trim().split(/\s/)[0] || "code");
      html +=
        '<div class="code"><div class="code-head"><span>' + label +
        '</span><button type="button" class="copy-code">copy</button></div><pre><code>' + escape(code) + "</code></pre></div>";
      if (i + 1 < parts.length) html += blocks(parts[i + 1].replace(/^[^\n]*\n?/, ""));
    }
    return html;
  }

  return { render, escape };
})();
