// A small Markdown renderer for model replies. Safety comes first: the whole source is
// HTML-escaped before any Markdown rule runs, so every rule works on inert text and can only
// add the fixed tags written below. Links are made only for http(s) and mailto URLs, and an
// escaped URL cannot leave its quoted attribute (quotes are entities by then).
//
// Covered: fenced code blocks (an unclosed fence while streaming runs to the end), headings,
// paragraphs with line breaks, bullet and numbered lists (nested by indentation), block
// quotes, horizontal rules, simple tables, `code`, **bold**, *italic*, ~~strike~~, links.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

export function renderMarkdown(source) {
  // NUL marks placeholders below, so none may come from the source.
  const escaped = escapeHtml(String(source ?? "").replace(/\u0000/g, ""));
  return blocks(escaped.split(/\r\n|\r|\n/));
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}&gt; ?/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function startsBlock(line, next) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line) ||
    isTableStart(line, next);
}

function isTableStart(line, next) {
  return line.includes("|") && next !== undefined && next.includes("-") && TABLE_SEP.test(next);
}

function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      const close = new RegExp(`^ {0,3}${m[1][0] === "`" ? "`" : "~"}{${m[1].length},}\\s*$`);
      const body = [];
      for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
      i++;
      const cls = m[2] ? ` class="language-${m[2]}"` : "";
      out.push(`<pre><code${cls}>${body.join("\n")}</code></pre>`);
    } else if (/^\s*$/.test(line)) {
      i++;
    } else if ((m = HEADING.exec(line))) {
      const n = m[1].length;
      out.push(`<h${n}>${inline(m[2])}</h${n}>`);
      i++;
    } else if (RULE.test(line)) {
      out.push("<hr>");
      i++;
    } else if (QUOTE.test(line)) {
      const inner = [];
      for (; i < lines.length && QUOTE.test(lines[i]); i++) inner.push(lines[i].replace(QUOTE, ""));
      out.push(`<blockquote>${blocks(inner)}</blockquote>`);
    } else if (ITEM.test(line)) {
      i = list(lines, i, out);
    } else if (isTableStart(line, lines[i + 1])) {
      i = table(lines, i, out);
    } else {
      const para = [];
      for (; i < lines.length && !/^\s*$/.test(lines[i]) && (para.length === 0 || !startsBlock(lines[i], lines[i + 1]));
        i++) para.push(lines[i].trim());
      out.push(`<p>${para.map(inline).join("<br>")}</p>`);
    }
  }
  return out.join("");
}

// One list from lines[i]; returns the index after it. Lines indented past the marker belong
// to the item above (a nested list or a continuation); a blank line inside a list is kept.
function list(lines, i, out) {
  const first = ITEM.exec(lines[i]);
  const ordered = /\d/.test(first[2]);
  const items = [];
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || /\d/.test(m[2]) !== ordered || m[1].length > first[1].length + 1) break;
    const indent = m[1].length + m[2].length + 1;
    const body = [m[3]];
    for (i++; i < lines.length; i++) {
      const l = lines[i];
      const blankThenMore = /^\s*$/.test(l) && i + 1 < lines.length && /^\s{2,}\S/.test(lines[i + 1]);
      if (!blankThenMore && !/^\s{2,}\S/.test(l)) break;
      body.push(l.slice(Math.min(indent, l.length - l.trimStart().length)));
    }
    items.push(body.length === 1 ? inline(body[0]) : blocks(body).replace(/^<p>([\s\S]*?)<\/p>/, "$1"));
  }
  const start = ordered ? parseInt(first[2], 10) : 1;
  const tag = ordered ? "ol" : "ul";
  const attr = ordered && start !== 1 ? ` start="${start}"` : "";
  out.push(`<${tag}${attr}>${items.map((x) => `<li>${x}</li>`).join("")}</${tag}>`);
  return i;
}

function cells(line) {
  return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => inline(c.trim()));
}

function table(lines, i, out) {
  const head = cells(lines[i]);
  const rows = [];
  for (i += 2; i < lines.length && lines[i].includes("|") && !/^\s*$/.test(lines[i]); i++) rows.push(cells(lines[i]));
  const tr = (cols, tag) => `<tr>${cols.map((c) => `<${tag}>${c}</${tag}>`).join("")}</tr>`;
  out.push(`<table><thead>${tr(head, "th")}</thead><tbody>${rows.map((r) => tr(r, "td")).join("")}</tbody></table>`);
  return i;
}

// Inline rules on escaped text. Code spans and links become placeholders first, so emphasis
// never runs inside code or inside an href.
function inline(text) {
  const held = [];
  const hold = (html) => `\u0000${held.push(html) - 1}\u0000`;
  let s = text.replace(/(`+)(?!`)([\s\S]*?[^`])\1(?!`)/g, (_, _ticks, code) => hold(`<code>${code}</code>`));
  // In a URL `&` may only start `&amp;`: an escaped quote or bracket ends the URL.
  s = s.replace(/\[([^\]]+)\]\(\s*((?:https?:\/\/|mailto:)(?:[^\s&()]|&amp;)+)\s*\)/g,
    (_, label, url) => hold(link(url, emphasis(label))));
  s = s.replace(/(^|[\s(])(https?:\/\/(?:[^\s&()]|&amp;)*[^\s&().,;:!?])/g, (_, pre, url) => pre + hold(link(url, url)));
  s = emphasis(s);
  for (let n = 0; n < 3 && s.includes("\u0000"); n++) s = s.replace(/\u0000(\d+)\u0000/g, (_, k) => held[+k]);
  return s;
}

function link(url, label) {
  return `<a href="${url}" target="_blank" rel="noopener noreferrer">${label}</a>`;
}

function emphasis(s) {
  return s
    .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/(^|[^*\w])\*(?=[^\s*])([^*]*?[^\s*])\*(?!\*)/g, "$1<em>$2</em>")
    .replace(/(^|[^\w])_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
}
